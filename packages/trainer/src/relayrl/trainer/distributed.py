"""The data-parallel group a trainer backend reduces over, and the helpers that reduce over it.

By default that is torch.distributed's default process group (initialised by the launcher, e.g.
``torchrun`` or ``relayrl run``'s ranks). A caller that manages its own group (elastic ranks, whose
group is re-formed when a rank dies) sets it with :func:`set_data_parallel_group`: any object with
``rank``, ``world``, ``all_reduce(tensor, op)`` and ``all_gather_object(value)``
(:class:`GroupCollectives` wraps a c10d ``ProcessGroup`` and lets the caller decide how to wait for
each operation).
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

__all__ = ["Collectives", "DefaultGroup", "GroupCollectives", "all_reduce_gradients", "all_reduce_metric_sums",
           "data_parallel_group", "data_parallel_shard", "set_data_parallel_group"]


class Collectives(Protocol):
    """What a data-parallel step needs from its group."""

    rank: int
    world: int

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Reduce ``tensor`` in place over the group (``op``: sum, min or max)."""

    def all_gather_object(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


class DefaultGroup:
    """torch.distributed's default process group."""

    def __init__(self) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        dist.all_reduce(tensor, op=_REDUCE_OPS[op])

    def all_gather_object(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered


class GroupCollectives:
    """A c10d ``ProcessGroup`` object (registered with torch.distributed or not) as :class:`Collectives`.

    Every operation is started asynchronously and handed to ``wait(work)``, which must return once
    the work has completed (``work.wait()`` by default; a caller may poll ``work.is_completed()``
    and give up on a group whose member has died instead of blocking until gloo's timeout).
    """

    def __init__(self, group: Any, *, wait: Callable[[Any], None] = lambda work: work.wait()) -> None:
        self.group, self.wait = group, wait
        self.rank, self.world = group.rank(), group.size()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = _REDUCE_OPS[op]
        self.wait(self.group.allreduce([tensor], options))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.wait(self.group.broadcast([tensor], options))

    def broadcast_object(self, value: Any, src: int = 0) -> Any:
        """``src``'s ``value`` on every rank (pickled: ranks of one run trust each other)."""
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8) if self.rank == src else None
        size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
        self.broadcast(size, src)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self.broadcast(payload, src)
        return value if self.rank == src else pickle.loads(payload.numpy().tobytes())

    def all_gather_object(self, value: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self.wait(self.group.allgather([sizes], [torch.tensor([data.numel()], dtype=torch.int64)]))
        longest = max(int(size.item()) for size in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:data.numel()] = data
        gathered = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        self.wait(self.group.allgather([gathered], [padded]))
        return [pickle.loads(tensor[:int(size.item())].numpy().tobytes()) for tensor, size in zip(gathered, sizes)]


_group: Collectives | None = None


def set_data_parallel_group(group: Collectives | None) -> None:
    """Make ``group`` the one :func:`data_parallel_group` returns (None: back to the default group)."""
    global _group
    _group = group


def data_parallel_group() -> Collectives | None:
    """The group set by :func:`set_data_parallel_group`, else torch.distributed's default group when
    it has more than one rank, else None (one process: nothing to reduce)."""
    if _group is not None:
        return _group if _group.world > 1 else None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return DefaultGroup()
    return None


def data_parallel_shard() -> tuple[int, int]:
    """``(rank, world size)`` of this process in its data-parallel group; ``(0, 1)`` alone."""
    group = data_parallel_group()
    return (group.rank, group.world) if group is not None else (0, 1)


def all_reduce_metric_sums(sums: Counter[str], group: Collectives | None = None) -> Counter[str]:
    """Sum (``*_min``/``*_max``: min/max) the per-rank metric sums over ranks; every rank gets the totals.

    Ranks may hold different names (a rank without micro-batches has none): names are gathered first.
    ``group``: default :func:`data_parallel_group`.
    """
    group = group or data_parallel_group() or DefaultGroup()
    names = sorted(set().union(*group.all_gather_object(sorted(sums))))
    reduced: Counter[str] = Counter()
    for op, selected in (("sum", [n for n in names if not n.endswith(("_min", "_max"))]),
                         ("min", [n for n in names if n.endswith("_min")]),
                         ("max", [n for n in names if n.endswith("_max")])):
        if not selected:
            continue
        neutral = {"sum": 0.0, "min": float("inf"), "max": float("-inf")}[op]
        values = torch.tensor([float(sums.get(name, neutral)) for name in selected], dtype=torch.float64)
        group.all_reduce(values, op)
        reduced.update(dict(zip(selected, values.tolist())))
    return reduced


def all_reduce_gradients(parameters: list[torch.nn.Parameter], group: Collectives | None = None) -> None:
    """Sum every parameter's ``.grad`` over ranks in one flat all-reduce (missing grads count as zero)."""
    group = group or data_parallel_group() or DefaultGroup()
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    flat = torch.cat([parameter.grad.reshape(-1) for parameter in parameters])
    group.all_reduce(flat)
    offset = 0
    for parameter in parameters:
        count = parameter.grad.numel()
        parameter.grad.copy_(flat[offset:offset + count].view_as(parameter.grad))
        offset += count
