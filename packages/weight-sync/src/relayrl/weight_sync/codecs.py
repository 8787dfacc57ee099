"""Tensor codecs: XOR deltas of raw bits, compressed with zstd in independent chunks.

A *delta* codec encodes the XOR of a tensor's new bit pattern and its base (the parent version's
bits): between RL steps most bf16 values keep their exact bits, so the XOR is mostly zero bytes and
zstd shrinks it 25x or more. A *full* codec encodes the bits themselves (snapshots). Every codec
works on flat ``uint8`` views (:mod:`relayrl.weight_sync.bits`) with the element width given, so
bfloat16, fp16, fp32 and fp8 are all just unsigned words.

Chunked frame format (every codec here except ``raw``)::

    header  "<4sBBHQII": magic b"RWS1", transform id, element bytes, flags (1 = XOR with a base),
            tensor bytes, chunk bytes, chunk count
    table   chunk count x u32 stored length, then chunk count x u8 mode (padded to 4 bytes)
    frames  the stored chunks, back to back

Each chunk (default 4 MiB, a multiple of the 1 MiB checksum block) is encoded on its own thread
with that thread's zstd context and reused scratch buffers, and stored in one of three modes:
``zstd`` (the transformed chunk compressed), ``raw`` (compression gained under ``min_gain``, 1% by
default, so decoding skips zstd), or ``zero`` (the XOR is all zero: nothing stored). The checksum
of the resulting bits is computed inside the same chunk tasks while the bytes are in cache.

Transforms applied to a chunk before zstd:

``plain``   nothing;
``planes``  byte planes split (all first bytes of the elements, then all second bytes ...), which
            groups the slowly-changing exponent bytes together;
``sparse``  indices (as gaps) and values of the non-zero elements, for very sparse deltas.

Which is best is measured by ``benchmarks/weight_sync/compression.py``: on bf16 under Adam-like
updates ``xor-sparse-zstd`` stored the fewest bytes at lr 1e-7, 1e-6 and 1e-5 (33x vs 25x for plain
XOR at 1e-6) and decoded fastest, so it is the default (numbers in ``docs/weight-sync.md``).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from relayrl.core.plugins import PluginManager, get_plugin_manager
from relayrl.weight_sync.checksum import BLOCK_BYTES, block_hashes, digest, tensor_checksum
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.hookspecs import CODECS
from relayrl.weight_sync.parallel import ChunkPool, compressor, decompressor, scratch

MAGIC = b"RWS1"
_HEADER = struct.Struct("<4sBBHQII")
_FLAG_XOR = 1
MODE_RAW, MODE_ZSTD, MODE_ZERO = 0, 1, 2
TRANSFORMS = {"plain": 0, "planes": 1, "sparse": 2}
_TRANSFORM_NAMES = {value: key for key, value in TRANSFORMS.items()}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

DEFAULT_DELTA_CODEC = "xor-sparse-zstd"
DEFAULT_FULL_CODEC = "zstd"


@dataclasses.dataclass
class EncodeItem:
    """One tensor to encode: its new bits, the base bits (None for a full codec), element width."""

    bits: np.ndarray
    base: np.ndarray | None
    element_bytes: int


@dataclasses.dataclass
class Encoded:
    """An encoded tensor: ``payload`` (a bytes-like) and the checksum of the bits it rebuilds."""

    payload: Any
    checksum: str
    chunks: int = 0
    zero_chunks: int = 0
    raw_chunks: int = 0


@dataclasses.dataclass
class DecodeItem:
    """One payload to decode into ``out``; ``base`` is the parent's bits for a delta (may be ``out``)."""

    payload: memoryview
    base: np.ndarray | None
    out: np.ndarray
    element_bytes: int
    name: str = "tensor"
    checksum: bool = True
    """Hash the result. Replaying several deltas hashes only the last version's bits: an error in an
    earlier one shows there, and sparse deltas applied in place then touch only the changed elements."""


class Codec(Protocol):
    """What a tensor codec offers. Registered through ``relayrl_weight_sync_codecs``."""

    name: str
    is_delta: bool
    """True when encoding needs the base bits and decoding applies onto them."""

    def encode_many(self, items: Sequence[EncodeItem], pool: ChunkPool) -> list[Encoded]:
        """Encode every item (chunks of all items share the pool); checksums are of ``item.bits``."""

    def decode_many(self, items: Sequence[DecodeItem], pool: ChunkPool) -> list[str]:
        """Decode every payload into its ``out``; the checksums of the results ("" where not asked for)."""


# ---------------------------------------------------------------------------------------- raw
class RawCodec:
    """Full tensors stored as their plain bits: no header, no compression, decodes by one copy."""

    name = "raw"
    is_delta = False

    def encode_many(self, items: Sequence[EncodeItem], pool: ChunkPool) -> list[Encoded]:
        return [Encoded(payload=item.bits, checksum=tensor_checksum(item.bits, pool)) for item in items]

    def decode_many(self, items: Sequence[DecodeItem], pool: ChunkPool) -> list[str]:
        for item in items:
            if len(item.payload) != item.out.size:
                raise WeightSyncError(f"{item.name}: raw payload of {len(item.payload)} bytes for a "
                                      f"{item.out.size}-byte tensor")
        tasks = []
        for index, item in enumerate(items):
            source = np.frombuffer(item.payload, np.uint8)
            tasks += [(index, source, item.out, start, min(start + _TASK_BYTES, item.out.size), item.checksum)
                      for start in range(0, item.out.size, _TASK_BYTES)] or [(index, source, item.out, 0, 0, item.checksum)]
        results = pool.map(_copy_task, tasks)
        return _gather_checksums(len(items), tasks, results, items)


_TASK_BYTES = 4 * BLOCK_BYTES


def _copy_task(index: int, source: np.ndarray, out: np.ndarray, start: int, end: int, checksum: bool) -> list[int]:
    np.copyto(out[start:end], source[start:end])
    return block_hashes(out[start:end]) if checksum else []


def _gather_checksums(count: int, tasks: Sequence[tuple[Any, ...]], results: Sequence[list[int]],
                      items: Sequence[DecodeItem]) -> list[str]:
    hashes: list[list[int]] = [[] for _ in range(count)]
    for task, part in zip(tasks, results):
        hashes[task[0]].extend(part)
    return [digest(hashes[index], item.out.size) if item.checksum else "" for index, item in enumerate(items)]


# ---------------------------------------------------------------------------------------- chunked
class ChunkedCodec:
    """XOR (optional) + transform + zstd over independent chunks; see the module docstring."""

    def __init__(self, name: str, *, transform: str = "plain", xor: bool = True, level: int = 1,
                 chunk_bytes: int = 4 * BLOCK_BYTES, min_gain: float = 0.01) -> None:
        if transform not in TRANSFORMS:
            raise WeightSyncError(f"codec {name!r}: unknown transform {transform!r} (known: {', '.join(TRANSFORMS)})")
        if chunk_bytes <= 0 or chunk_bytes % BLOCK_BYTES:
            raise WeightSyncError(f"codec {name!r}: chunk_bytes must be a positive multiple of {BLOCK_BYTES}, got {chunk_bytes}")
        self.name = name
        self.transform = transform
        self.is_delta = xor
        self.level = level
        self.chunk_bytes = chunk_bytes
        self.min_gain = min_gain

    def __repr__(self) -> str:
        return f"ChunkedCodec({self.name!r}, transform={self.transform!r}, level={self.level}, chunk_bytes={self.chunk_bytes})"

    # ------------------------------------------------------------------ encode
    def encode_many(self, items: Sequence[EncodeItem], pool: ChunkPool) -> list[Encoded]:
        tasks = []
        for index, item in enumerate(items):
            if self.is_delta and item.base is not None and item.base.size != item.bits.size:
                raise WeightSyncError(f"codec {self.name}: base has {item.base.size} bytes, tensor {item.bits.size}")
            starts = range(0, item.bits.size, self.chunk_bytes)
            tasks += [(index, item.bits, item.base if self.is_delta else None, start,
                       min(start + self.chunk_bytes, item.bits.size), item.element_bytes) for start in starts]
        results = pool.map(self._encode_chunk, tasks)
        per_item: list[list[tuple[int, Any, list[int]]]] = [[] for _ in items]
        for task, result in zip(tasks, results):
            per_item[task[0]].append(result)
        return [self._assemble(item, chunks) for item, chunks in zip(items, per_item)]

    def _encode_chunk(self, index: int, bits: np.ndarray, base: np.ndarray | None, start: int, end: int,
                      element_bytes: int) -> tuple[int, Any, list[int]]:
        source = bits[start:end]
        hashes = block_hashes(source)
        if base is not None:
            delta = scratch("xor", end - start)
            np.bitwise_xor(source, base[start:end], out=delta)
            if not _any_nonzero(delta):
                return MODE_ZERO, b"", hashes
        else:
            delta = source
        transformed = _forward(self.transform, delta, element_bytes)
        frame = compressor(self.level).compress(transformed)
        if len(frame) > (1.0 - self.min_gain) * delta.size:
            return MODE_RAW, delta.tobytes(), hashes  # a copy: ``delta`` may be a reused scratch buffer
        return MODE_ZSTD, frame, hashes

    def _assemble(self, item: EncodeItem, chunks: list[tuple[int, Any, list[int]]]) -> Encoded:
        flags = _FLAG_XOR if self.is_delta and item.base is not None else 0
        header = _HEADER.pack(MAGIC, TRANSFORMS[self.transform], item.element_bytes, flags, item.bits.size,
                              self.chunk_bytes, len(chunks))
        lengths = np.array([len(stored) for _, stored, _ in chunks], dtype="<u4").tobytes()
        modes = bytes(mode for mode, _, _ in chunks)
        modes += b"\0" * (-len(modes) % 4)
        payload = b"".join([header, lengths, modes, *[stored for _, stored, _ in chunks]])
        checksum = digest([value for _, _, hashes in chunks for value in hashes], item.bits.size)
        return Encoded(payload=payload, checksum=checksum, chunks=len(chunks),
                       zero_chunks=sum(mode == MODE_ZERO for mode, _, _ in chunks),
                       raw_chunks=sum(mode == MODE_RAW for mode, _, _ in chunks))

    # ------------------------------------------------------------------ decode
    def decode_many(self, items: Sequence[DecodeItem], pool: ChunkPool) -> list[str]:
        tasks = []
        for index, item in enumerate(items):
            tasks += self._decode_tasks(index, item)
        results = pool.map(_decode_chunk, tasks)
        return _gather_checksums(len(items), tasks, results, items)

    def _decode_tasks(self, index: int, item: DecodeItem) -> list[tuple[Any, ...]]:
        view = item.payload
        if len(view) < _HEADER.size:
            raise WeightSyncError(f"{item.name}: payload of {len(view)} bytes is shorter than a frame header")
        magic, transform, element_bytes, flags, total, chunk_bytes, count = _HEADER.unpack_from(view, 0)
        if magic != MAGIC or transform not in _TRANSFORM_NAMES:
            raise WeightSyncError(f"{item.name}: not a {self.name} payload (bad magic or transform)")
        if total != item.out.size or element_bytes != item.element_bytes:
            raise WeightSyncError(f"{item.name}: payload is for {total} bytes of {element_bytes}-byte elements, "
                                  f"the tensor has {item.out.size} bytes of {item.element_bytes}-byte elements")
        expected_count = -(-total // chunk_bytes) if chunk_bytes else 0
        if count != expected_count:
            raise WeightSyncError(f"{item.name}: {count} chunks cannot cover {total} bytes in chunks of {chunk_bytes}")
        xor = bool(flags & _FLAG_XOR)
        if xor and item.base is None:
            raise WeightSyncError(f"{item.name}: a delta payload needs its base version's bits")
        table = _HEADER.size
        lengths = np.frombuffer(view, dtype="<u4", count=count, offset=table)
        modes = bytes(view[table + 4 * count: table + 5 * count])
        offset = table + 4 * count + count + (-count % 4)
        ends = offset + np.cumsum(lengths, dtype=np.int64)
        if count and int(ends[-1]) != len(view):
            raise WeightSyncError(f"{item.name}: chunk table covers {int(ends[-1])} bytes, payload has {len(view)}")
        tasks = []
        begin = offset
        for chunk in range(count):
            start = chunk * chunk_bytes
            end = min(start + chunk_bytes, total)
            tasks.append((index, _TRANSFORM_NAMES[transform], element_bytes, modes[chunk],
                          view[begin:int(ends[chunk])], item.base if xor else None, item.out, start, end, item.name,
                          item.checksum))
            begin = int(ends[chunk])
        return tasks


def _any_nonzero(delta: np.ndarray) -> bool:
    if delta.size % 8 == 0:
        return bool(delta.view(np.uint64).any())
    return bool(delta.any())


def _forward(transform: str, delta: np.ndarray, element_bytes: int) -> np.ndarray:
    if transform == "planes" and element_bytes > 1 and delta.size % element_bytes == 0:
        planes = scratch("planes", delta.size)
        planes_2d = planes.reshape(element_bytes, -1)
        elements = delta.reshape(-1, element_bytes)
        for plane in range(element_bytes):  # strided copies run ~4x faster than one transposed copy
            planes_2d[plane] = elements[:, plane]
        return planes
    if transform == "sparse" and element_bytes in _UINT and delta.size % element_bytes == 0:
        words = delta.view(_UINT[element_bytes])
        mask = scratch("mask", words.size).view(np.bool_)
        np.not_equal(words, 0, out=mask)        # flatnonzero of a bool mask is ~3x faster than of words
        where = np.flatnonzero(mask).astype(np.uint32)
        gaps = np.diff(where, prepend=np.uint32(0)).astype("<u4")
        return np.concatenate([np.array([where.size], "<u4").view(np.uint8), gaps.view(np.uint8),
                               words[where].view(np.uint8)])
    return delta


def _decode_chunk(index: int, transform: str, element_bytes: int, mode: int, stored: memoryview,
                  base: np.ndarray | None, out: np.ndarray, start: int, end: int, name: str,
                  checksum: bool = True) -> list[int]:
    _apply_chunk(transform, element_bytes, mode, stored, base, out, start, end, name)
    return block_hashes(out[start:end]) if checksum else []


def _apply_chunk(transform: str, element_bytes: int, mode: int, stored: memoryview, base: np.ndarray | None,
                 out: np.ndarray, start: int, end: int, name: str) -> None:
    target = out[start:end]
    size = end - start
    base_part = base[start:end] if base is not None else None
    if mode == MODE_ZERO:
        if base_part is None:
            target.fill(0)
        elif base is not out:
            np.copyto(target, base_part)
        return
    if mode == MODE_RAW:
        if len(stored) != size:
            raise WeightSyncError(f"{name}: raw chunk at byte {start} has {len(stored)} bytes, expected {size}")
        delta = np.frombuffer(stored, np.uint8)
    elif mode == MODE_ZSTD:
        if transform == "sparse" and element_bytes in _UINT and size % element_bytes == 0:
            _apply_sparse(stored, base_part, base is out, target, element_bytes, name, start)
            return
        # Without a base the plain transform decompresses straight into the tensor.
        direct = base_part is None and transform == "plain"
        frame_out = target if direct else scratch("frame", size)
        _decompress_into(stored, frame_out, name, start)
        if direct:
            return
        delta = _inverse(transform, frame_out, element_bytes)
    else:
        raise WeightSyncError(f"{name}: unknown chunk mode {mode} at byte {start}")
    if base_part is None:
        np.copyto(target, delta)
    else:
        np.bitwise_xor(base_part, delta, out=target)


def _decompress_into(stored: memoryview, out: np.ndarray, name: str, start: int) -> None:
    import zstandard

    try:
        got = decompressor().stream_reader(stored).readinto(memoryview(out))
    except zstandard.ZstdError as exc:
        raise WeightSyncError(f"{name}: corrupt zstd chunk at byte {start} ({exc})") from None
    if got != out.size:
        raise WeightSyncError(f"{name}: zstd chunk at byte {start} decoded to {got} bytes, expected {out.size}")


def _inverse(transform: str, frame: np.ndarray, element_bytes: int) -> np.ndarray:
    if transform == "planes" and element_bytes > 1 and frame.size % element_bytes == 0:
        delta = scratch("unplanes", frame.size)
        elements = delta.reshape(-1, element_bytes)
        planes_2d = frame.reshape(element_bytes, -1)
        for plane in range(element_bytes):
            elements[:, plane] = planes_2d[plane]
        return delta
    return frame


def _apply_sparse(stored: memoryview, base_part: np.ndarray | None, in_place: bool, target: np.ndarray,
                  element_bytes: int, name: str, start: int) -> None:
    import zstandard

    try:
        packed = np.frombuffer(decompressor().decompress(stored), np.uint8)
    except zstandard.ZstdError as exc:
        raise WeightSyncError(f"{name}: corrupt zstd chunk at byte {start} ({exc})") from None
    count = int(packed[:4].view("<u4")[0])
    expected = 4 + count * (4 + element_bytes)
    if packed.size != expected:
        raise WeightSyncError(f"{name}: sparse chunk at byte {start} has {packed.size} bytes, expected {expected}")
    where = np.cumsum(packed[4:4 + 4 * count].view("<u4"), dtype=np.int64)
    values = packed[4 + 4 * count:].view(_UINT[element_bytes])
    if base_part is None:
        target.fill(0)
    elif not in_place:
        np.copyto(target, base_part)
    words = target.view(_UINT[element_bytes])
    if count and where[-1] >= words.size:
        raise WeightSyncError(f"{name}: sparse chunk at byte {start} indexes past its end")
    words[where] ^= values


# ---------------------------------------------------------------------------------------- registry
BUILTIN_CODECS: dict[str, tuple[Callable[..., Codec], str]] = {
    "raw": (lambda **options: RawCodec(), "full tensors as plain bits (no compression)"),
    "zstd": (lambda **options: ChunkedCodec("zstd", transform="plain", xor=False, **options),
             "full tensors, chunked zstd"),
    "planes-zstd": (lambda **options: ChunkedCodec("planes-zstd", transform="planes", xor=False, **options),
                    "full tensors, byte planes split, chunked zstd"),
    "xor-zstd": (lambda **options: ChunkedCodec("xor-zstd", transform="plain", xor=True, **options),
                 "XOR of bits against the parent, chunked zstd"),
    "xor-planes-zstd": (lambda **options: ChunkedCodec("xor-planes-zstd", transform="planes", xor=True, **options),
                        "XOR against the parent, byte planes split, chunked zstd"),
    "xor-sparse-zstd": (lambda **options: ChunkedCodec("xor-sparse-zstd", transform="sparse", xor=True, **options),
                        "XOR against the parent as index gaps + values of changed elements, chunked zstd (the default delta codec)"),
}


def make_codec(name: str, *, pm: PluginManager | None = None, **options: Any) -> Codec:
    """Build codec ``name`` from the registry (``options``: ``level``, ``chunk_bytes``, ``min_gain``).

    Uses the built-in table when the plugin manager lacks the codec hook (the package imported from
    a source tree without its entry point installed).
    """
    pm = get_plugin_manager() if pm is None else pm
    if getattr(pm.hook, "relayrl_weight_sync_codecs", None) is None:
        factories = {key: factory for key, (factory, _) in BUILTIN_CODECS.items()}
    else:
        factories = {key: record.factory for key, record in CODECS.registrations(pm).items()}
    if name not in factories:
        raise WeightSyncError(f"unknown weight codec {name!r} (available: {', '.join(sorted(factories))})")
    return factories[name](**options)
