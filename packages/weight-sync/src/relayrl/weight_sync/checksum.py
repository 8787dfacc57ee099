"""Checksums of tensor bits: CRC-32 of every 1 MiB block, rolled up into one 64-bit digest.

Why this construction: zlib.crc32 runs ~3.9 GB/s on one core here (blake2b ~0.8 GB/s) and releases
the GIL, but one CRC over a whole tensor is sequential. Hashing fixed 1 MiB blocks independently lets
codecs fold the checksum into their chunk tasks (the block is still in cache after it was decoded)
and lets a verification pass use every core. The block CRCs and the length are then digested with
blake2b (a few bytes per MiB, so its speed does not matter) into the value a manifest stores::

    crc32t1m:<16 hex digits>

Every block keeps CRC-32's guarantees (all bursts up to 32 bits detected); the digest ties the
blocks together in order. It guards against corruption and wrong bases, not against an adversary.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from relayrl.weight_sync.parallel import ChunkPool

BLOCK_BYTES = 1 << 20
"""Bytes per checksummed block; codec chunk sizes are multiples of it."""

PREFIX = "crc32t1m:"
_BLOCKS_PER_TASK = 16


def block_crcs(bits: np.ndarray) -> list[int]:
    """CRC-32 of each :data:`BLOCK_BYTES` block of ``bits`` (the last block may be shorter)."""
    return [zlib.crc32(bits[start:start + BLOCK_BYTES]) for start in range(0, bits.size, BLOCK_BYTES)]


def digest(crcs: list[int] | np.ndarray, total_bytes: int) -> str:
    """The checksum string of a tensor of ``total_bytes`` bytes whose block CRCs are ``crcs``."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(int(total_bytes).to_bytes(8, "little"))
    hasher.update(np.asarray(crcs, dtype="<u4").tobytes())
    return PREFIX + hasher.hexdigest()


def tensor_checksum(bits: np.ndarray, pool: ChunkPool | None = None) -> str:
    """The checksum string of the ``uint8`` array ``bits``, computed on ``pool``'s threads."""
    span = BLOCK_BYTES * _BLOCKS_PER_TASK
    ranges = [(bits[start:start + span],) for start in range(0, bits.size, span)]
    parts = pool.map(block_crcs, ranges) if pool is not None else [block_crcs(*item) for item in ranges]
    return digest([crc for part in parts for crc in part], bits.size)
