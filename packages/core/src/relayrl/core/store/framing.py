"""The checksum trailer every relayrl object carries.

An object written by :meth:`relayrl.core.store.Store.put` is the payload followed by a 24-byte
trailer::

    payload | magic b"RLRLOBJ1" (8) | payload length, u64 LE (8) | CRC-32 of payload, u32 LE (4) | 0 (4)

A trailer (rather than a header) keeps byte offsets inside the payload unchanged, so ranged reads
(weight manifests address tensors by offset) need no adjustment. The length field makes a torn
object (one a non-atomic backend exposed half-written) detectable even when its last bytes happen
to look like a trailer. CRC-32 runs at several GB/s from the standard library; it guards against
truncation and corruption, not against an adversary.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"RLRLOBJ1"
_TRAILER = struct.Struct("<8sQII")
TRAILER_SIZE = _TRAILER.size  # 24


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 of ``data`` (an unsigned 32-bit int)."""
    return zlib.crc32(data) & 0xFFFFFFFF


def make_trailer(payload: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """The trailer to append after ``payload``, and the payload's checksum."""
    crc = checksum(payload)
    return _TRAILER.pack(MAGIC, len(payload), crc, 0), crc


def parse_trailer(trailer: bytes | memoryview, total_size: int) -> tuple[int, int] | None:
    """``(payload_length, checksum)`` from the last 24 bytes of an object, or None if malformed."""
    if len(trailer) != TRAILER_SIZE:
        return None
    magic, length, crc, _reserved = _TRAILER.unpack(trailer)
    if magic != MAGIC or length + TRAILER_SIZE != total_size:
        return None
    return length, crc


def unframe(blob: bytes | bytearray | memoryview) -> tuple[memoryview, int] | str:
    """The payload (a zero-copy view) and its checksum, or a sentence saying what is wrong."""
    view = memoryview(blob)
    if len(view) < TRAILER_SIZE:
        return f"object is {len(view)} bytes, shorter than its {TRAILER_SIZE}-byte trailer (truncated?)"
    parsed = parse_trailer(view[-TRAILER_SIZE:], len(view))
    if parsed is None:
        return "object has no valid trailer (truncated, or not written by relayrl)"
    length, crc = parsed
    payload = view[:length]
    actual = checksum(payload)
    if actual != crc:
        return f"checksum mismatch: trailer says {crc:08x}, payload hashes to {actual:08x} (corrupted)"
    return payload, crc
