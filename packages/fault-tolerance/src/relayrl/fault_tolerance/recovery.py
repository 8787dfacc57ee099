"""Recovery: the newest checkpoint that is complete and verifies on some replica.

Candidates are the steps whose commit records for every rank exist on at least one replica (the
local store first, then peers). For each candidate, newest first, every rank's shard must read back
whole (size and checksum as committed) from one replica; this rank's state is loaded from the first
replica where it verifies. When that is a peer, the local store is rebuilt from it, so a node whose
disk was lost gets its checkpoint back. ``latest`` pointers are never trusted: a pointer can be
ahead of a torn write or behind a newer commit.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import torch

from relayrl.core.errors import ObjectNotFound, StoreError
from relayrl.fault_tolerance.checkpoint import CheckpointStore

__all__ = ["Recovered", "recover"]


@dataclasses.dataclass
class Recovered:
    step: int
    state: Any
    source: str
    """URL of the store the state was read from."""
    rebuilt_local: bool
    """The local copy was missing or damaged and was rewritten from a peer."""
    discarded: list[int] = dataclasses.field(default_factory=list)
    """Newer committed steps that verify on no replica (damaged everywhere): their training is redone,
    and the caller should say so."""


def _verifies_somewhere(step: int, replicas: Sequence[CheckpointStore], world_size: int) -> bool:
    return all(any(_readable(replica, step, rank) for replica in replicas) for rank in range(world_size))


def _readable(replica: CheckpointStore, step: int, rank: int) -> bool:
    try:
        replica.read_shard(step, rank)
        return True
    except (StoreError, ObjectNotFound):
        return False


def recover(local: CheckpointStore, peers: Sequence[CheckpointStore] = (), *,
            at_most: int | None = None) -> Recovered | None:
    """Load this rank's state from the newest complete, verified checkpoint; None if there is none.

    ``at_most`` ignores newer steps: ranks that recovered different steps (each saw its own
    replicas) agree on the oldest of them and recover again at most that step.
    """
    replicas = [local, *peers]
    candidates: set[int] = set()
    for replica in replicas:
        try:
            candidates.update(replica.committed_steps())
        except StoreError:
            continue  # an unreachable peer offers nothing
    if at_most is not None:
        candidates = {step for step in candidates if step <= at_most}
    discarded: list[int] = []
    for step in sorted(candidates, reverse=True):
        if not _verifies_somewhere(step, replicas, local.world_size):
            discarded.append(step)
            continue
        for replica in replicas:
            try:
                payload = replica.read_shard(step)
            except (StoreError, ObjectNotFound):
                continue
            rebuilt = replica is not local
            if rebuilt:
                local.write(step, payload)
            state = torch.load(io.BytesIO(payload), weights_only=False, map_location="cpu")
            return Recovered(step=step, state=state, source=replica.store.url, rebuilt_local=rebuilt,
                             discarded=sorted(discarded))
    return None
