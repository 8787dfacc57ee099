"""Rollout segments on the bus: their names, and the producer that commits them.

A segment is one :class:`relayrl.core.wire.RolloutSegment` (msgpack + zstd) stored under::

    <prefix>/<producer_id>/<sequence:012d>.seg

The name carries the producer id and a per-producer sequence number, so every group has a stable
identity, :class:`GroupRef` ``(producer_id, sequence, index)``, that the trainer's cursor can
name. Commits are conditional creates (``put(if_absent=True)``): a retried commit whose first
attempt did land finds its own bytes there and succeeds; a different writer's bytes under the same
name are a collision, which the producer resolves by moving to a fresh sequence number.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

from relayrl.core import codec, wire
from relayrl.core.errors import ObjectExists, StoreError
from relayrl.core.store import Store

SUFFIX = ".seg"
SEQUENCE_DIGITS = 12
_PRODUCER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SegmentConflict(StoreError):
    """A segment name kept colliding with another writer's segment (two live producers, one id)."""


def check_producer_id(producer_id: str) -> str:
    """Return ``producer_id`` if it can name segments, else raise ValueError naming it."""
    if not isinstance(producer_id, str) or not _PRODUCER_ID.match(producer_id):
        raise ValueError(f"producer id {producer_id!r}: use 1-128 characters from [A-Za-z0-9._-], "
                         "starting with a letter or digit")
    return producer_id


def segment_key(prefix: str, producer_id: str, sequence: int) -> str:
    """The object key of segment ``sequence`` of ``producer_id`` under ``prefix``."""
    if sequence < 0 or sequence >= 10 ** SEQUENCE_DIGITS:
        raise ValueError(f"segment sequence {sequence} out of range")
    return f"{prefix.strip('/')}/{check_producer_id(producer_id)}/{sequence:0{SEQUENCE_DIGITS}d}{SUFFIX}"


def parse_segment_key(prefix: str, key: str) -> tuple[str, int] | None:
    """``(producer_id, sequence)`` of a segment key, or None for any other object under ``prefix``."""
    head = prefix.strip("/") + "/"
    if not key.startswith(head) or not key.endswith(SUFFIX):
        return None
    parts = key[len(head):-len(SUFFIX)].split("/")
    if len(parts) != 2 or not _PRODUCER_ID.match(parts[0]) or len(parts[1]) != SEQUENCE_DIGITS or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


@dataclasses.dataclass(frozen=True, order=True)
class GroupRef:
    """The stable identity of one committed group: which producer, which segment, which position."""

    producer_id: str
    sequence: int
    index: int

    def __str__(self) -> str:
        return f"{self.producer_id}/{self.sequence}/{self.index}"


class SegmentWriter:
    """Producer side: collects scored groups and commits them as numbered segments.

    On construction the writer lists its own segments and resumes after the highest sequence, so a
    restarted producer (same ``producer_id``) never overwrites what its previous life committed. A
    producer that dies loses only the groups it had not committed yet.

    Example::

        writer = SegmentWriter(store, "rollout-7", groups_per_segment=4)
        for group in scored_groups():
            writer.add(group)          # commits every 4 groups
        writer.flush()                 # commits the rest
    """

    #: Fresh sequence numbers tried when a name collides with another writer's segment.
    max_collisions = 8

    def __init__(self, store: Store, producer_id: str, *, prefix: str = "rollouts", groups_per_segment: int = 4,
                 clock: Callable[[], float] = time.time) -> None:
        if groups_per_segment < 1:
            raise ValueError(f"groups_per_segment must be >= 1, got {groups_per_segment}")
        self.store = store
        self.producer_id = check_producer_id(producer_id)
        self.prefix = prefix.strip("/")
        self.groups_per_segment = groups_per_segment
        self._clock = clock
        self._pending: list[wire.Group] = []
        self._last_created_at = 0.0
        self.next_sequence = self._first_free_sequence()
        self.committed: list[str] = []
        """Keys this writer committed, in order."""

    @classmethod
    def from_config(cls, store: Store, producer_id: str, config: Any) -> SegmentWriter:
        """A writer with the ``prefix`` and ``groups_per_segment`` of a :class:`BufferSection`."""
        return cls(store, producer_id, prefix=config.prefix, groups_per_segment=config.groups_per_segment)

    def _first_free_sequence(self) -> int:
        taken = [parsed[1] for key in self.store.list(f"{self.prefix}/{self.producer_id}/")
                 if (parsed := parse_segment_key(self.prefix, key)) is not None and parsed[0] == self.producer_id]
        return max(taken) + 1 if taken else 0

    @property
    def pending_groups(self) -> int:
        return len(self._pending)

    def add(self, group: wire.Group) -> str | None:
        """Queue ``group``; commit a segment when ``groups_per_segment`` are queued. Returns its key, if any."""
        self._pending.append(group)
        if len(self._pending) >= self.groups_per_segment:
            return self.flush()
        return None

    def flush(self) -> str | None:
        """Commit the queued groups (if any) as one segment; return its key."""
        if not self._pending:
            return None
        key = self.commit(self._pending)
        self._pending = []
        return key

    def commit(self, groups: list[wire.Group]) -> str:
        """Commit ``groups`` as the next segment, atomically and exactly once; return its key.

        The encoded bytes are fixed before the first attempt, so a retry after an ambiguous failure
        (the put landed but the reply was lost) finds identical bytes and counts as success.
        """
        # created_at orders segments across producers; never let it run backwards within one
        # producer, even if the wall clock does.
        created_at = max(self._clock(), self._last_created_at)
        for _ in range(self.max_collisions):
            sequence = self.next_sequence
            key = segment_key(self.prefix, self.producer_id, sequence)
            segment = wire.RolloutSegment(producer_id=self.producer_id, sequence=sequence, groups=list(groups),
                                          created_at=created_at)
            data = codec.encode_compressed(segment)
            if self._put_once(key, data):
                self.next_sequence = sequence + 1
                self._last_created_at = created_at
                self.committed.append(key)
                return key
            # Another writer holds this name (a zombie of our previous life?): take a fresh number.
            self.next_sequence = max(sequence + 1, self._first_free_sequence())
        raise SegmentConflict(f"producer {self.producer_id!r}: {self.max_collisions} segment names in a row were "
                              f"taken by another writer under {self.store.url}/{self.prefix}/{self.producer_id}/; "
                              "are two live producers using the same id?")

    def _put_once(self, key: str, data: bytes) -> bool:
        """True when ``key`` now holds ``data`` (written now or by an earlier attempt of ours)."""
        try:
            self.store.put(key, data, if_absent=True)
            return True
        except ObjectExists:
            return self.store.get(key) == data
