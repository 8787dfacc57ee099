"""Codecs rebuild exact bits for every width and size, fall back to raw/zero chunks, and catch bad input."""

from __future__ import annotations

import numpy as np
import pytest

from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl
from relayrl.weight_sync.checksum import BLOCK_BYTES
from relayrl.weight_sync.codecs import BUILTIN_CODECS, DecodeItem, EncodeItem, make_codec
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.hookspecs import CODECS
from relayrl.weight_sync.parallel import ChunkPool
from relayrl.weight_sync.testing import CodecTests
from relayrl.weight_sync.testing.codec_tests import changed_pair

DELTA_CODECS = [name for name in BUILTIN_CODECS if name.startswith("xor-")]
MIB = BLOCK_BYTES


@pytest.fixture(scope="module")
def pool():
    with ChunkPool(3) as chunk_pool:
        yield chunk_pool


class TestBuiltinCodecs(CodecTests):
    """Every built-in codec passes the suite a plugin codec passes."""

    @pytest.fixture(params=sorted(BUILTIN_CODECS))
    def codec(self, request):
        return make_codec(request.param, chunk_bytes=2 * MIB) if request.param != "raw" else make_codec("raw")


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
    new, base = changed_pair(4 * MIB, 2, changed=0.01)
    for name in DELTA_CODECS:
        encoded = make_codec(name).encode_many([EncodeItem(new, base, 2)], pool)[0]
        assert len(encoded.payload) * 10 < new.size, f"{name}: {len(encoded.payload)} bytes"


def test_corrupt_or_mismatched_payloads_raise_naming_the_tensor(pool):
    codec = make_codec("xor-zstd")
    new, base = changed_pair(MIB, 2, changed=0.02)
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
    table = CODECS.registrations(pm)
    assert set(BUILTIN_CODECS) <= set(table)
    assert table["xor-zstd-9"].plugin == "codec-plugin"
    assert make_codec("xor-zstd-9", pm=pm).level == 9
