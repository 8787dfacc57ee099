"""A weight codec: full tensors compressed with the standard library's zlib.

A codec turns a tensor's bits into a payload and back, exactly: weight sync verifies every version
by checksum, so ``decode_many`` returns the checksum of what it wrote, and a payload that does not
decode to the tensor's size raises :class:`WeightSyncError` naming the tensor.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from relayrl.weight_sync.checksum import tensor_checksum
from relayrl.weight_sync.codecs import DecodeItem, Encoded, EncodeItem
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool


class ZlibCodec:
    """Full tensors (``is_delta = False``), one zlib stream each."""

    name = "relayrl-template"
    is_delta = False

    def __init__(self, *, level: int = 1, chunk_bytes: int = 0, min_gain: float = 0.0) -> None:
        self.level = level  # chunk_bytes and min_gain ([weight_sync] chunk_mib, min_gain) have no use here

    def encode_many(self, items: Sequence[EncodeItem], pool: ChunkPool) -> list[Encoded]:
        return [Encoded(payload=zlib.compress(item.bits.tobytes(), self.level),
                        checksum=tensor_checksum(item.bits, pool)) for item in items]

    def decode_many(self, items: Sequence[DecodeItem], pool: ChunkPool) -> list[str]:
        checksums = []
        for item in items:
            try:
                data = zlib.decompress(item.payload)
            except zlib.error as exc:
                raise WeightSyncError(f"{item.name}: payload does not decode: {exc}") from None
            if len(data) != item.out.size:
                raise WeightSyncError(f"{item.name}: payload decodes to {len(data)} bytes for a {item.out.size}-byte tensor")
            item.out[:] = np.frombuffer(data, np.uint8)
            checksums.append(tensor_checksum(item.out, pool) if item.checksum else "")
        return checksums
