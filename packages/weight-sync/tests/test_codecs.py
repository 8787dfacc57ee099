"""Codecs rebuild exact bits for every width and size, fall back to raw/zero chunks, and catch bad input."""

from __future__ import annotations

import numpy as np
import pytest

from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl
from relayrl.weight_sync.checksum import BLOCK_BYTES, tensor_checksum
from relayrl.weight_sync.codecs import BUILTIN_CODECS, DecodeItem, EncodeItem, codec_registry, make_codec
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool

DELTA_CODECS = [name for name in BUILTIN_CODECS if name.startswith("xor-")]
FULL_CODECS = [name for name in BUILTIN_CODECS if not name.startswith("xor-")]
MIB = BLOCK_BYTES


@pytest.fixture(scope="module")
def pool():
    with ChunkPool(3) as chunk_pool:
        yield chunk_pool


def _pair(size_bytes: int, element_bytes: int, changed: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size_bytes, dtype=np.uint8)
    new = base.copy()
    elements = size_bytes // element_bytes
    if elements:
        where = rng.choice(elements, int(elements * changed), replace=False) * element_bytes
        new[where] ^= rng.integers(1, 256, where.size, dtype=np.uint8)
    return new, base


@pytest.mark.parametrize("name", DELTA_CODECS)
@pytest.mark.parametrize(("size", "element_bytes"), [(0, 2), (2, 2), (1_001, 1), (3 * MIB + 6, 2), (9 * MIB + 4, 4),
                                                     (2 * MIB + 16, 8)])
def test_delta_codecs_rebuild_exact_bits_out_of_place_and_in_place(pool, name, size, element_bytes):
    codec = make_codec(name, chunk_bytes=2 * MIB)
    new, base = _pair(size, element_bytes, changed=0.03)
    encoded = codec.encode_many([EncodeItem(new, base, element_bytes)], pool)[0]
    assert encoded.checksum == tensor_checksum(new)
    out = np.full(size, 0xAB, np.uint8)
    [checksum] = codec.decode_many([DecodeItem(memoryview(encoded.payload), base, out, element_bytes)], pool)
    assert np.array_equal(out, new) and checksum == encoded.checksum
    in_place = base.copy()
    unhashed = codec.decode_many([DecodeItem(memoryview(encoded.payload), in_place, in_place, element_bytes,
                                             checksum=False)], pool)
    assert np.array_equal(in_place, new) and unhashed == [""]


@pytest.mark.parametrize("name", FULL_CODECS)
def test_full_codecs_rebuild_exact_bits(pool, name):
    codec = make_codec(name, chunk_bytes=MIB)
    rng = np.random.default_rng(1)
    bits = (rng.normal(0, 0.02, 700_001).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    encoded = codec.encode_many([EncodeItem(bits, None, 2)], pool)[0]
    out = np.zeros_like(bits)
    [checksum] = codec.decode_many([DecodeItem(memoryview(encoded.payload).cast("B"), None, out, 2)], pool)
    assert np.array_equal(out, bits) and checksum == tensor_checksum(bits)


def test_unchanged_chunks_store_nothing_and_incompressible_chunks_are_stored_raw(pool):
    codec = make_codec("xor-zstd", chunk_bytes=MIB)
    base = np.random.default_rng(2).integers(0, 256, 4 * MIB, dtype=np.uint8)
    new = base.copy()
    new[MIB: 2 * MIB] = np.random.default_rng(3).integers(0, 256, MIB, dtype=np.uint8)   # random: no gain
    new[3 * MIB + 10] ^= 1                                                               # one bit
    encoded = codec.encode_many([EncodeItem(new, base, 2)], pool)[0]
    assert (encoded.chunks, encoded.zero_chunks, encoded.raw_chunks) == (4, 2, 1)
    out = np.empty_like(base)
    codec.decode_many([DecodeItem(memoryview(encoded.payload), base, out, 2)], pool)
    assert np.array_equal(out, new)
    assert len(encoded.payload) < MIB + 4096


def test_xor_delta_of_small_changes_compresses_well(pool):
    new, base = _pair(4 * MIB, 2, changed=0.01)
    for name in DELTA_CODECS:
        encoded = make_codec(name).encode_many([EncodeItem(new, base, 2)], pool)[0]
        assert len(encoded.payload) * 10 < new.size, f"{name}: {len(encoded.payload)} bytes"


def test_a_wrong_base_is_caught_by_the_checksum(pool):
    codec = make_codec("xor-zstd")
    new, base = _pair(MIB, 2, changed=0.02)
    encoded = codec.encode_many([EncodeItem(new, base, 2)], pool)[0]
    wrong_base = base.copy()
    wrong_base[5] ^= 0x40
    out = np.empty_like(base)
    [checksum] = codec.decode_many([DecodeItem(memoryview(encoded.payload), wrong_base, out, 2)], pool)
    assert checksum != encoded.checksum


def test_corrupt_or_mismatched_payloads_raise_naming_the_tensor(pool):
    codec = make_codec("xor-zstd")
    new, base = _pair(MIB, 2, changed=0.02)
    payload = bytearray(codec.encode_many([EncodeItem(new, base, 2)], pool)[0].payload)
    out = np.empty_like(base)
    with pytest.raises(WeightSyncError, match="layer.7"):
        codec.decode_many([DecodeItem(memoryview(payload[:-3]), base, out, 2, "layer.7")], pool)
    with pytest.raises(WeightSyncError, match="layer.7.*2-byte"):
        codec.decode_many([DecodeItem(memoryview(bytes(payload)), base, np.empty(2 * MIB, np.uint8), 2, "layer.7")], pool)
    with pytest.raises(WeightSyncError, match="needs its base"):
        codec.decode_many([DecodeItem(memoryview(bytes(payload)), None, out, 2, "layer.7")], pool)
    garbled = bytearray(payload)
    garbled[-20:] = b"\x00" * 20
    with pytest.raises(WeightSyncError, match="layer.7"):
        codec.decode_many([DecodeItem(memoryview(garbled), base, out, 2, "layer.7")], pool)


def test_many_tensors_share_the_pool_and_keep_their_order(pool):
    codec = make_codec("xor-planes-zstd", chunk_bytes=MIB)
    pairs = [_pair(size, 2, 0.05, seed) for seed, size in enumerate([10, 3 * MIB, 0, 200_000, MIB])]
    encoded = codec.encode_many([EncodeItem(new, base, 2) for new, base in pairs], pool)
    outs = [np.empty_like(base) for _, base in pairs]
    sums = codec.decode_many([DecodeItem(memoryview(item.payload), base, out, 2)
                              for item, (_, base), out in zip(encoded, pairs, outs)], pool)
    for (new, _), out, item, checksum in zip(pairs, outs, encoded, sums):
        assert np.array_equal(out, new) and checksum == item.checksum


def test_codec_options_are_validated():
    with pytest.raises(WeightSyncError, match="multiple of"):
        make_codec("xor-zstd", chunk_bytes=1000)
    with pytest.raises(WeightSyncError, match="unknown weight codec 'lz5'.*xor-zstd"):
        make_codec("lz5")


def test_registry_lists_builtins_and_accepts_a_plugin_codec(isolated_plugins):
    class Plugin:
        @hookimpl
        def relayrl_weight_sync_codecs(self):
            yield Registration("xor-zstd-9", lambda **options: make_codec("xor-zstd", **{**options, "level": 9}),
                               "XOR delta at zstd level 9")

    pm = create_plugin_manager(plugins=[("codec-plugin", Plugin())])
    table = codec_registry(pm)
    assert set(BUILTIN_CODECS) <= set(table)
    assert table["xor-zstd-9"].plugin == "codec-plugin"
    assert make_codec("xor-zstd-9", pm=pm).level == 9
