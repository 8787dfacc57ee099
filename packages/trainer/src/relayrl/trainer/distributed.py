"""Helpers for data-parallel trainer backends (torch.distributed already initialised)."""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

__all__ = ["all_reduce_gradients", "all_reduce_metric_sums", "data_parallel_shard"]


def data_parallel_shard() -> tuple[int, int]:
    """``(rank, world size)`` of this process's default process group; ``(0, 1)`` when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_metric_sums(sums: Counter[str]) -> Counter[str]:
    """Sum (``*_min``/``*_max``: min/max) the per-rank metric sums over ranks; every rank gets the totals.

    Ranks may hold different names (a rank without micro-batches has none): names are gathered first.
    """
    gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, sorted(sums))
    names = sorted(set().union(*gathered))
    reduced: Counter[str] = Counter()
    for op, selected in ((dist.ReduceOp.SUM, [n for n in names if not n.endswith(("_min", "_max"))]),
                         (dist.ReduceOp.MIN, [n for n in names if n.endswith("_min")]),
                         (dist.ReduceOp.MAX, [n for n in names if n.endswith("_max")])):
        if not selected:
            continue
        neutral = {dist.ReduceOp.SUM: 0.0, dist.ReduceOp.MIN: float("inf"), dist.ReduceOp.MAX: float("-inf")}[op]
        values = torch.tensor([float(sums.get(name, neutral)) for name in selected], dtype=torch.float64)
        dist.all_reduce(values, op=op)
        reduced.update(dict(zip(selected, values.tolist())))
    return reduced


def all_reduce_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's ``.grad`` over ranks in one flat all-reduce (missing grads count as zero)."""
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    flat = torch.cat([parameter.grad.reshape(-1) for parameter in parameters])
    dist.all_reduce(flat)
    offset = 0
    for parameter in parameters:
        count = parameter.grad.numel()
        parameter.grad.copy_(flat[offset:offset + count].view_as(parameter.grad))
        offset += count
