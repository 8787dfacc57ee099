"""Restart re-balancing: draw the first batches after a restart in the running task/duration mix.

While the trainer is down, rollouts keep finishing, but not evenly: short tasks finish many times
over, long ones not at all. Batching that backlog in commit order would train the first steps
after a restart on a burst of short, easy tasks, a bias the run never asked for. So the buffer
keeps a *running mix*, the exponentially averaged share of each stratum among the groups it
trained, in its checkpointed state; for the first ``rebalance_batches`` batches after a restore it
draws from the backlog in proportion to that mix (deficit round robin over strata, commit order
within a stratum). The surplus of over-represented strata waits, and whatever ages past the
staleness bound meanwhile is dropped by the staleness policy. When a stratum has too few groups
(the long tasks that had not finished), the others fill its places in proportion to their own
shares and the batch reports the shortfall: waiting for hour-long rollouts would stall the trainer.

A stratum is ``<task>|d<bucket>``: the task (``task_id`` or a group metadata key such as a task
family, since a large task pool sees each task too rarely for a per-task share) and the bucket of
the group's duration (its longest trajectory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from relayrl.buffer.config import RestartSection
from relayrl.buffer.groups import PendingGroup, duration_bucket

MIX_FLOOR = 1e-4
"""Strata whose running share falls below this are forgotten, which keeps the state small."""


def stratum_of(group: PendingGroup, config: RestartSection) -> str:
    """The stratum ``<task>|d<bucket>`` of ``group``."""
    if config.stratum == "task_id":
        task = group.group.task_id
    elif config.stratum.startswith("metadata:"):
        task = group.group.metadata.get(config.stratum[len("metadata:"):], "")
    else:
        raise ValueError(f"buffer.restart.stratum: {config.stratum!r}; expected 'task_id' or 'metadata:<key>'")
    return f"{task}|d{duration_bucket(group.duration_s, config.duration_buckets_s)}"


def update_mix(mix: Mapping[str, float], strata: Sequence[str], decay: float) -> dict[str, float]:
    """The running mix after a batch whose groups have ``strata``."""
    if not strata:
        return dict(mix)
    counts: dict[str, int] = {}
    for stratum in strata:
        counts[stratum] = counts.get(stratum, 0) + 1
    if not mix:  # the first batch defines the mix
        return {stratum: count / len(strata) for stratum, count in sorted(counts.items())}
    updated = {}
    for stratum in sorted(set(mix) | set(counts)):
        share = decay * mix.get(stratum, 0.0) + (1.0 - decay) * counts.get(stratum, 0) / len(strata)
        if share >= MIX_FLOOR:
            updated[stratum] = share
    return updated


def stratified_order(candidates: Iterable[tuple[str, PendingGroup]], mix: Mapping[str, float]) -> list[PendingGroup]:
    """``candidates`` (stratum, group), in commit order, reordered so every prefix follows ``mix``.

    Deficit round robin: the next pick comes from the stratum furthest below its share of the
    picks so far (ties: the smaller stratum name); within a stratum, commit order. Strata absent
    from the mix come last, in commit order, to fill places no mixed stratum can.
    """
    queues: dict[str, list[PendingGroup]] = {}
    rest: list[PendingGroup] = []
    for stratum, group in candidates:
        if mix.get(stratum, 0.0) > 0.0:
            queues.setdefault(stratum, []).append(group)
        else:
            rest.append(group)
    total_share = sum(mix[stratum] for stratum in queues) or 1.0
    shares = {stratum: mix[stratum] / total_share for stratum in queues}
    heads = dict.fromkeys(queues, 0)
    picked = dict.fromkeys(queues, 0)
    ordered: list[PendingGroup] = []
    live = sorted(queues)
    while live:
        n = len(ordered) + 1
        stratum = max(live, key=lambda s: (shares[s] * n - picked[s], _reverse(s)))
        ordered.append(queues[stratum][heads[stratum]])
        heads[stratum] += 1
        picked[stratum] += 1
        if heads[stratum] == len(queues[stratum]):
            live.remove(stratum)
    return ordered + rest


def shortfall(strata: Sequence[str], mix: Mapping[str, float]) -> int:
    """Places in a batch of ``strata`` that its mix owed to strata that had too few groups."""
    if not mix or not strata:
        return 0
    total = sum(mix.values())
    counts: dict[str, int] = {}
    for stratum in strata:
        counts[stratum] = counts.get(stratum, 0) + 1
    return sum(max(0, int(share / total * len(strata)) - counts.get(stratum, 0)) for stratum, share in mix.items())


def _reverse(text: str) -> tuple[int, ...]:
    # max() with ties broken towards the lexicographically smaller name.
    return (*tuple(-ord(char) for char in text), 0)
