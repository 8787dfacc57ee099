"""The trainer's ranks: one process per data-parallel rank (``[trainer] ranks``), rank 0 leading.

``relayrl run`` starts ``ranks`` trainer processes with torch.distributed's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Rank 0, the leader, owns
everything that talks to the bus and the run directory: it reads the buffer, runs the warm-up,
publishes weights, writes metrics, the ledger, progress and status. Every rank holds its backend's
shard of the model and optimiser and writes its own checkpoint shard.

Collective calls must come in the same order on every rank, so the ranks never decide anything on
their own: each iteration of the trainer loop, the leader broadcasts one :class:`Decision` (train
on this batch, nothing yet, or stop) and every rank acts on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from relayrl.core.wire import Group

__all__ = ["Decision", "Ranks", "broadcast_decision"]

# A rank waits in a collective while the leader warms up or recovers: allow for that, not forever
# (a dead rank is noticed by the launcher, which restarts the whole group; with [trainer] elastic,
# see relayrl.trainer.elastic).
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=1)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank does next: ``train`` (on ``groups`` with ``weights``), ``wait``, ``stop``,
    ``republish``, or (elastic ranks) ``regroup`` into the group ``view`` describes."""

    kind: str
    groups: list[Group] = dataclasses.field(default_factory=list)
    weights: list[float] | None = None
    view: bytes | None = None
    """``regroup``: the encoded :class:`relayrl.trainer.elastic.View` every member forms next."""


def broadcast_decision(ranks: Any, decision: Decision | None) -> Decision:
    """The leader's decision on every rank of ``ranks`` (world > 1); groups travel msgpack-encoded."""
    message = None
    if ranks.leader:
        assert decision is not None
        message = (decision.kind, msgspec.msgpack.encode(decision.groups), decision.weights, decision.view)
    kind, groups, weights, view = ranks.broadcast(message)
    if ranks.leader:
        return decision  # type: ignore[return-value]
    return Decision(kind, msgspec.msgpack.decode(groups, type=list[Group]), weights, view)


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's ranks (a world of one when started alone)."""

    rank: int = 0
    world: int = 1
    elastic = False

    @classmethod
    def from_env(cls) -> Ranks:
        return cls(rank=int(os.environ.get("RANK", "0")), world=int(os.environ.get("WORLD_SIZE", "1")))

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def init(self) -> None:
        """Join the process group (gloo on CPU, nccl with CUDA); nothing to do in a world of one."""
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)

    def broadcast(self, value: Any) -> Any:
        """The leader's ``value`` on every rank (picklable; identity in a world of one)."""
        if self.world == 1:
            return value
        box = [value if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_decision(self, decision: Decision | None) -> Decision:
        """The leader's decision on every rank (see :func:`broadcast_decision`)."""
        if self.world == 1:
            assert decision is not None
            return decision
        return broadcast_decision(self, decision)

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy the leader's parameters and buffers into every rank's ``module`` (after the warm-up)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def agree_on_min(self, value: int) -> int:
        """The smallest ``value`` any rank holds, on every rank."""
        if self.world == 1:
            return value
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return min(values)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
