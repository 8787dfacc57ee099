"""The exactly-once cursor: which committed groups are resolved (trained on or dropped).

Per producer, a *watermark* (every segment below it is fully resolved) plus the sparse set of
resolved groups above it. Groups can resolve out of commit order (a restart re-balances, a token
budget stops short), so a single offset would not do; the sparse part stays as small as the
backlog, and the watermark moves up as segments complete, so the state does not grow with the run.

The cursor changes only when the buffer hands out a batch; the trainer stores the batch's state
with the step it trains (see ``docs/buffer.md`` for the argument).
"""

from __future__ import annotations

from typing import Any

import msgspec

from relayrl.buffer.segments import GroupRef
from relayrl.core.errors import WireError

STATE_VERSION = 1


class ProducerCursor(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved groups of one producer."""

    watermark: int = 0
    """Every segment with a smaller sequence number is fully resolved."""
    complete: list[int] = []
    """Fully resolved segments above the watermark (sorted)."""
    partial: dict[int, list[int]] = {}
    """Segment sequence -> resolved group indices, for segments not fully resolved (sorted)."""


class BufferState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a restarted buffer needs to continue exactly once; goes into the trainer checkpoint."""

    state_version: int = STATE_VERSION
    batches: int = 0
    """Batches handed out so far."""
    resolved_groups: int = 0
    """Groups trained on or dropped so far."""
    producers: dict[str, ProducerCursor] = {}
    mix: dict[str, float] = {}
    """Running share of each stratum among trained groups (see :mod:`relayrl.buffer.restart`)."""

    @classmethod
    def coerce(cls, value: BufferState | dict[str, Any] | bytes) -> BufferState:
        """Accept a state, its ``msgspec.to_builtins`` dict, or its msgpack bytes."""
        try:
            if isinstance(value, BufferState):
                state = value
            elif isinstance(value, (bytes, bytearray, memoryview)):
                state = msgspec.msgpack.decode(value, type=cls)
            else:
                state = msgspec.convert(value, cls, strict=False)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise WireError(f"buffer state: invalid: {exc}") from None
        if state.state_version > STATE_VERSION:
            raise WireError(f"buffer state: written with state version {state.state_version}, this relayrl-buffer "
                            f"reads up to {STATE_VERSION}; upgrade relayrl-buffer")
        return state

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self)


class _ProducerProgress:
    __slots__ = ("complete", "partial", "watermark")

    def __init__(self, watermark: int = 0, complete: set[int] | None = None,
                 partial: dict[int, set[int]] | None = None) -> None:
        self.watermark = watermark
        self.complete = complete or set()
        self.partial = partial or {}


class Cursor:
    """Mutable form of the per-producer progress in :class:`BufferState`."""

    def __init__(self) -> None:
        self._producers: dict[str, _ProducerProgress] = {}
        self.resolved_groups = 0

    @classmethod
    def from_state(cls, state: BufferState) -> Cursor:
        cursor = cls()
        cursor.resolved_groups = state.resolved_groups
        for producer_id, progress in state.producers.items():
            cursor._producers[producer_id] = _ProducerProgress(
                progress.watermark, set(progress.complete),
                {sequence: set(indices) for sequence, indices in progress.partial.items()})
        return cursor

    def to_states(self) -> dict[str, ProducerCursor]:
        return {producer_id: ProducerCursor(watermark=progress.watermark, complete=sorted(progress.complete),
                                            partial={sequence: sorted(indices)
                                                     for sequence, indices in sorted(progress.partial.items())})
                for producer_id, progress in sorted(self._producers.items())}

    def segment_done(self, producer_id: str, sequence: int) -> bool:
        """Whether every group of the segment is resolved (so it need not even be downloaded)."""
        progress = self._producers.get(producer_id)
        return progress is not None and (sequence < progress.watermark or sequence in progress.complete)

    def is_resolved(self, ref: GroupRef) -> bool:
        progress = self._producers.get(ref.producer_id)
        if progress is None:
            return False
        if ref.sequence < progress.watermark or ref.sequence in progress.complete:
            return True
        return ref.index in progress.partial.get(ref.sequence, ())

    def resolve(self, ref: GroupRef, segment_size: int) -> None:
        """Mark ``ref`` resolved; ``segment_size`` (groups in its segment) decides when the segment is complete."""
        if self.is_resolved(ref):
            raise ValueError(f"group {ref} resolved twice (a bug in the buffer: please report it)")
        progress = self._producers.setdefault(ref.producer_id, _ProducerProgress())
        indices = progress.partial.setdefault(ref.sequence, set())
        indices.add(ref.index)
        self.resolved_groups += 1
        if len(indices) >= segment_size:
            self.complete_segment(ref.producer_id, ref.sequence)

    def complete_segment(self, producer_id: str, sequence: int) -> None:
        progress = self._producers.setdefault(producer_id, _ProducerProgress())
        progress.partial.pop(sequence, None)
        progress.complete.add(sequence)
        while progress.watermark in progress.complete:
            progress.complete.remove(progress.watermark)
            progress.watermark += 1
