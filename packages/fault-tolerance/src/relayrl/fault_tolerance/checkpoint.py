"""Per-step trainer checkpoints: snapshot to CPU, write in the background, commit atomically, replicate.

Layout in a store (relayrl-core's :class:`Store`: atomic puts, CRC trailer on every object)::

    checkpoints/step-000000042/rank-00000.pt        the rank's state (torch.save of a nested dict)
    checkpoints/step-000000042/rank-00000.commit    written last, if absent: size and CRC of the shard
    checkpoints/latest                              the newest committed step (a hint, never trusted alone)

A checkpoint of ``world_size`` ranks is *complete* when every ``rank-R.commit`` exists and each
shard reads back whole with the recorded size and checksum. ``latest`` moves only after the commit
record is durable, and recovery does not rely on it: it lists commit records. Retention deletes only
complete checkpoints older than the newest ``keep`` complete ones, and never one being written.

:class:`AsyncCheckpointer` blocks the trainer only for the copy to CPU memory; serialising and
writing (to the local store and every peer store) happen on a background thread, one checkpoint at
a time, in order; at most ``max_in_flight`` (default 1) saves are in flight at once, so snapshot
memory stays bounded and, with the default, step N - 1 is durable once step N is saved. A failure there
surfaces at the next ``save`` or ``wait``.

A trainer that resumes from step S redoes the steps after it, so before it saves again each rank
discards its own files of those later steps (:meth:`AsyncCheckpointer.discard_after`): a step only
some ranks committed before a crash, or one that no longer verifies, would otherwise block the
commit of the redone step (its commit record exists, with other content).
"""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgspec
import torch

from relayrl.core import codec
from relayrl.core.errors import ChecksumMismatch, ObjectExists, ObjectNotFound, RelayrlError, StoreError
from relayrl.core.store import Store
from relayrl.fault_tolerance.faults import maybe_kill

__all__ = ["AsyncCheckpointer", "CheckpointCommit", "CheckpointStore", "SaveResult", "to_cpu"]

log = logging.getLogger(__name__)

PREFIX = "checkpoints"
_STEP = re.compile(r"^checkpoints/step-(\d{9})/rank-(\d{5})\.commit$")


class CheckpointCommit(msgspec.Struct, frozen=True, kw_only=True):
    """The commit record of one rank's shard: written after the shard, read before trusting it."""

    schema_version: int = 1
    step: int
    rank: int
    world_size: int
    shard_key: str
    size: int
    checksum: int
    created_at: float


def _shard_key(step: int, rank: int) -> str:
    return f"{PREFIX}/step-{step:09d}/rank-{rank:05d}.pt"


def _commit_key(step: int, rank: int) -> str:
    return f"{PREFIX}/step-{step:09d}/rank-{rank:05d}.commit"


def to_cpu(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor cloned to CPU memory (what the trainer waits for)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_cpu(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(item) for item in value)
    return value


class CheckpointStore:
    """Checkpoints of one rank in one store (a node's local disk, or a peer's replica)."""

    def __init__(self, store: Store, *, rank: int = 0, world_size: int = 1) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"CheckpointStore({self.store.url!r}, rank={self.rank})"

    # ------------------------------------------------------------------ writing
    def write(self, step: int, payload: bytes) -> CheckpointCommit:
        """Write this rank's shard of ``step``, then its commit record; move ``latest``."""
        info = self.store.put(_shard_key(step, self.rank), payload)
        maybe_kill("mid-write", step)  # fault injection: shard written, commit not yet
        commit = CheckpointCommit(step=step, rank=self.rank, world_size=self.world_size, shard_key=info.key,
                                  size=info.size, checksum=info.checksum, created_at=time.time())
        try:
            self.store.put(_commit_key(step, self.rank), codec.encode(commit), if_absent=True)
        except ObjectExists as exc:
            # A retry after a crash between commit and pointer: the commit must describe our shard.
            existing = self.read_commit(step, self.rank)
            if existing is None or (existing.size, existing.checksum) != (commit.size, commit.checksum):
                raise StoreError(f"{self.store.url}: step {step} rank {self.rank} already committed with other "
                                 "content") from exc
        if self.rank == 0:
            self.store.put(f"{PREFIX}/latest", str(step).encode())
        return commit

    # ------------------------------------------------------------------ reading
    def read_commit(self, step: int, rank: int) -> CheckpointCommit | None:
        try:
            return codec.decode(self.store.get(_commit_key(step, rank)), CheckpointCommit, what=_commit_key(step, rank))
        except (ObjectNotFound, ChecksumMismatch, RelayrlError):
            return None

    def committed_steps(self) -> list[int]:
        """Steps for which every rank's commit record exists here, newest first (shards not yet read)."""
        ranks: dict[int, set[int]] = {}
        for key in self.store.list(f"{PREFIX}/"):
            match = _STEP.match(key)
            if match:
                ranks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
        complete = [step for step, present in ranks.items() if present >= set(range(self.world_size))]
        return sorted(complete, reverse=True)

    def read_shard(self, step: int, rank: int | None = None) -> bytes:
        """The verified bytes of a rank's shard; raises if missing, torn or not matching its commit."""
        rank = self.rank if rank is None else rank
        commit = self.read_commit(step, rank)
        if commit is None:
            raise ObjectNotFound(f"{self.store.url}: step {step} rank {rank} has no valid commit record")
        data = self.store.get(commit.shard_key)  # verifies the CRC trailer
        if len(data) != commit.size:
            raise ChecksumMismatch(f"{self.store.url}/{commit.shard_key}: {len(data)} bytes, commit says {commit.size}")
        return data

    def verify(self, step: int) -> bool:
        """Whether every rank's shard of ``step`` reads back whole here."""
        try:
            for rank in range(self.world_size):
                self.read_shard(step, rank)
        except (StoreError, ObjectNotFound):
            return False
        return True

    def load(self, step: int) -> Any:
        return torch.load(io.BytesIO(self.read_shard(step)), weights_only=False, map_location="cpu")

    # ------------------------------------------------------------------ retention
    def discard_after(self, step: int) -> list[int]:
        """Delete this rank's files of every step after ``step``, commit record first; return the steps."""
        own = re.compile(rf"^{PREFIX}/step-(\d{{9}})/rank-{self.rank:05d}\.(commit|pt)$")
        doomed: dict[int, list[str]] = {}
        for key in self.store.list(f"{PREFIX}/"):
            match = own.match(key)
            if match and int(match.group(1)) > step:
                doomed.setdefault(int(match.group(1)), []).append(key)
        for keys in doomed.values():
            for key in sorted(keys, key=lambda key: not key.endswith(".commit")):  # the commit goes first
                self.store.delete(key)
        return sorted(doomed)

    def prune(self, keep: int, *, protect: Sequence[int] = ()) -> list[int]:
        """Delete this rank's files of complete checkpoints older than the newest ``keep``; return the steps."""
        complete = self.committed_steps()
        if len(complete) <= keep:
            return []
        doomed = [step for step in complete[keep:] if step not in protect]
        for step in doomed:
            # Commit record first: a half-deleted checkpoint is then merely incomplete, never trusted.
            self.store.delete(_commit_key(step, self.rank))
            self.store.delete(_shard_key(step, self.rank))
        return doomed


class SaveResult(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    blocking_s: float
    """Time the trainer waited: the copy to CPU memory, plus any wait for an earlier write."""


class AsyncCheckpointer:
    """Snapshot now, write later: see the module docstring."""

    def __init__(self, local: Store, *, peers: Sequence[Store] = (), rank: int = 0, world_size: int = 1,
                 keep: int = 3, max_in_flight: int = 1) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.local = CheckpointStore(local, rank=rank, world_size=world_size)
        self.peers = [CheckpointStore(peer, rank=rank, world_size=world_size) for peer in peers]
        self.keep = keep
        self.max_in_flight = max_in_flight
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self.last_write_s = 0.0
        """Seconds the newest finished write took on the background thread (serialise, write, prune)."""
        self.last_write_bytes = 0
        """Bytes of the newest finished write's payload (one replica)."""

    def save(self, step: int, state: dict[str, Any]) -> SaveResult:
        """Copy ``state`` to CPU (blocking), then serialise and write it in the background.

        At most ``max_in_flight`` saves are in flight (written or queued); past that, ``save`` first
        waits for the oldest. This bounds the CPU memory held by snapshots when storage is slower
        than a step, and guarantees that once step N is saved, step N - max_in_flight is durable.
        """
        self._raise_failures()
        started = time.perf_counter()
        self._wait_for_room()
        snapshot = to_cpu(state)
        blocking = time.perf_counter() - started
        with self._lock:
            self._pending.append(self._executor.submit(self._write, step, snapshot))
        return SaveResult(step=step, blocking_s=blocking)

    def _write(self, step: int, snapshot: dict[str, Any]) -> None:
        started = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(snapshot, buffer)
        payload = buffer.getvalue()
        for target in [self.local, *self.peers]:
            target.write(step, payload)
        for target in [self.local, *self.peers]:
            target.prune(self.keep, protect=(step,))
        self.last_write_s = time.perf_counter() - started
        self.last_write_bytes = len(payload)

    def discard_after(self, step: int) -> list[int]:
        """Before resuming from ``step``: delete this rank's files of later steps, locally and on every
        peer that answers (see the module docstring); return the steps discarded locally."""
        self.wait()
        discarded = self.local.discard_after(step)
        for peer in self.peers:
            try:
                peer.discard_after(step)
            except StoreError as exc:  # an unreachable peer: the next save to it will tell
                log.warning("checkpoint peer %s: could not discard steps after %d: %s", peer.store.url, step, exc)
        return discarded

    def wait(self) -> None:
        """Block until every save so far is written; raise the first background failure."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def _wait_for_room(self) -> None:
        while True:
            with self._lock:
                if len(self._pending) < self.max_in_flight:
                    return
                oldest = self._pending.pop(0)
            oldest.result()

    def _raise_failures(self) -> None:
        with self._lock:
            done = [future for future in self._pending if future.done()]
            self._pending = [future for future in self._pending if not future.done()]
        for future in done:
            future.result()

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)
