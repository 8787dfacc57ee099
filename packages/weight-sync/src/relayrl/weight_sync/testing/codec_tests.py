"""``CodecTests``: the conformance suite every weight codec passes, built in or plugin.

Subclass it and override the ``codec`` fixture::

    from relayrl.weight_sync.testing import CodecTests

    class TestMyCodec(CodecTests):
        @pytest.fixture
        def codec(self):
            return MyCodec(chunk_bytes=2 * 1024 * 1024)

Weight sync is bit-exact: an engine serves exactly the bits the trainer published, verified by
checksum. So every check here is exact: decoded bits equal the encoded ones for every element width
and size (empty, one element, unaligned, several chunks), in place and out of place, for many
tensors at once in order; the checksum a decode returns is the checksum of what it wrote (so a
wrong base shows up); a payload cut short or garbled raises :class:`WeightSyncError` naming the
tensor instead of writing silently wrong bits. Delta codecs (``is_delta``) are checked against a
base; full codecs without one.
"""

from __future__ import annotations

import numpy as np
import pytest

from relayrl.weight_sync.checksum import BLOCK_BYTES, tensor_checksum
from relayrl.weight_sync.codecs import Codec, DecodeItem, EncodeItem
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool

MIB = BLOCK_BYTES
SIZES = [(0, 2), (2, 2), (1_001, 1), (3 * MIB + 6, 2), (9 * MIB + 4, 4), (2 * MIB + 16, 8)]
"""(bytes, element width) pairs: empty, one bf16, odd bytes, several chunks of each width."""


def changed_pair(size_bytes: int, element_bytes: int, changed: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(new, base)`` random bits where a fraction ``changed`` of the elements differ (an update)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size_bytes, dtype=np.uint8)
    new = base.copy()
    elements = size_bytes // element_bytes
    if elements:
        where = rng.choice(elements, int(elements * changed), replace=False) * element_bytes
        new[where] ^= rng.integers(1, 256, where.size, dtype=np.uint8)
    return new, base


class CodecTests:
    """Conformance suite for :class:`relayrl.weight_sync.codecs.Codec` implementations."""

    @pytest.fixture
    def codec(self) -> Codec:
        raise NotImplementedError("override the `codec` fixture to return the codec under test")

    @pytest.fixture
    def pool(self):
        with ChunkPool(3) as chunk_pool:
            yield chunk_pool

    def _encode(self, codec: Codec, pool: ChunkPool, new: np.ndarray, base: np.ndarray, width: int):
        return codec.encode_many([EncodeItem(new, base if codec.is_delta else None, width)], pool)[0]

    def _base(self, codec: Codec, base: np.ndarray) -> np.ndarray | None:
        return base if codec.is_delta else None

    def test_it_declares_its_name_and_kind(self, codec) -> None:
        assert isinstance(codec.name, str) and codec.name and isinstance(codec.is_delta, bool)

    @pytest.mark.parametrize(("size", "width"), SIZES)
    def test_decoding_rebuilds_the_exact_bits_and_their_checksum(self, codec, pool, size, width) -> None:
        new, base = changed_pair(size, width, changed=0.03)
        encoded = self._encode(codec, pool, new, base, width)
        assert encoded.checksum == tensor_checksum(new)
        out = np.full(size, 0xAB, np.uint8)  # garbage where the decode must write
        [checksum] = codec.decode_many([DecodeItem(memoryview(encoded.payload).cast("B"), self._base(codec, base),
                                                   out, width)], pool)
        assert np.array_equal(out, new) and checksum == encoded.checksum

    def test_decoding_in_place_over_the_base_and_without_a_checksum(self, codec, pool) -> None:
        new, base = changed_pair(3 * MIB + 6, 2, changed=0.05, seed=4)
        encoded = self._encode(codec, pool, new, base, 2)
        in_place = base.copy()
        unhashed = codec.decode_many([DecodeItem(memoryview(encoded.payload).cast("B"), self._base(codec, in_place),
                                                 in_place, 2, checksum=False)], pool)
        assert np.array_equal(in_place, new) and unhashed == [""]

    def test_many_tensors_share_the_pool_and_keep_their_order(self, codec, pool) -> None:
        pairs = [changed_pair(size, 2, 0.05, seed) for seed, size in enumerate([10, 3 * MIB, 0, 200_000, MIB])]
        encoded = codec.encode_many([EncodeItem(new, self._base(codec, base), 2) for new, base in pairs], pool)
        outs = [np.empty_like(base) for _, base in pairs]
        sums = codec.decode_many([DecodeItem(memoryview(item.payload).cast("B"), self._base(codec, base), out, 2)
                                  for item, (_, base), out in zip(encoded, pairs, outs)], pool)
        for (new, _), out, item, checksum in zip(pairs, outs, encoded, sums):
            assert np.array_equal(out, new) and checksum == item.checksum == tensor_checksum(new)

    def test_a_wrong_base_shows_in_the_checksum(self, codec, pool) -> None:
        if not codec.is_delta:
            pytest.skip(f"{codec.name} is a full codec: it has no base to get wrong")
        new, base = changed_pair(MIB, 2, changed=0.02)
        encoded = self._encode(codec, pool, new, base, 2)
        wrong = base.copy()
        wrong[5] ^= 0x40
        out = np.empty_like(base)
        [checksum] = codec.decode_many([DecodeItem(memoryview(encoded.payload).cast("B"), wrong, out, 2)], pool)
        assert checksum != encoded.checksum

    def test_a_payload_cut_short_raises_naming_the_tensor(self, codec, pool) -> None:
        new, base = changed_pair(MIB, 2, changed=0.02)
        payload = bytes(self._encode(codec, pool, new, base, 2).payload)
        out = np.empty_like(base)
        with pytest.raises(WeightSyncError, match="layer.7"):
            codec.decode_many([DecodeItem(memoryview(payload[:-3]), self._base(codec, base), out, 2, "layer.7")], pool)

    def test_a_payload_for_another_size_raises_naming_the_tensor(self, codec, pool) -> None:
        new, base = changed_pair(MIB, 2, changed=0.02)
        payload = bytes(self._encode(codec, pool, new, base, 2).payload)
        bigger = np.empty(2 * MIB, np.uint8)
        with pytest.raises(WeightSyncError, match="layer.7"):
            codec.decode_many([DecodeItem(memoryview(payload), self._base(codec, bigger), bigger, 2, "layer.7")], pool)
