"""Packed little-endian arrays for wire messages.

Long agent trajectories carry tens of thousands of tokens, each with a logprob and a kept-set.
As msgpack lists these would cost a Python object per number on both ends; packed into ``bytes``
they encode as one binary blob, decode without allocation per element, and convert to numpy or
torch with no copy (``numpy.frombuffer(span.tokens, "<u4")``).

Conventions: token ids, offsets and kept ids are ``uint32`` (vocabularies stay below 2**32);
logprobs are ``float32``. All little-endian.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable

_U32 = "I" if array("I").itemsize == 4 else "L"
_F32 = "f"
_BIG_ENDIAN = sys.byteorder == "big"


def _pack(typecode: str, values: Iterable[float] | Iterable[int] | array) -> bytes:
    packed = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if _BIG_ENDIAN:  # pragma: no cover - no big-endian CI
        packed = array(typecode, packed)
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes | memoryview) -> array:
    out = array(typecode)
    out.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        out.byteswap()
    return out


def pack_u32(values: Iterable[int]) -> bytes:
    """Pack non-negative ints below 2**32 as little-endian uint32 bytes."""
    try:
        return _pack(_U32, values)
    except OverflowError as exc:
        raise ValueError(f"value out of uint32 range: {exc}") from None


def unpack_u32(data: bytes | memoryview) -> array:
    """Unpack little-endian uint32 bytes into an ``array`` of ints."""
    return _unpack(_U32, data)


def pack_f32(values: Iterable[float]) -> bytes:
    """Pack floats as little-endian float32 bytes."""
    return _pack(_F32, values)


def unpack_f32(data: bytes | memoryview) -> array:
    """Unpack little-endian float32 bytes into an ``array`` of floats."""
    return _unpack(_F32, data)


def run_length_encode(values: Iterable[int]) -> list[tuple[int, int]]:
    """``[5, 5, 5, 6]`` → ``[(5, 3), (6, 1)]``."""
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs


def run_length_decode(runs: Iterable[tuple[int, int]]) -> list[int]:
    """``[(5, 3), (6, 1)]`` → ``[5, 5, 5, 6]``."""
    out: list[int] = []
    for value, count in runs:
        out.extend([value] * count)
    return out
