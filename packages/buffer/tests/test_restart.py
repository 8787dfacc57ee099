"""Restart policy: a backlog skewed towards short tasks is batched in the running mix, its surplus ages out."""

from __future__ import annotations

import collections
import itertools

import msgspec
import pytest

from relayrl.buffer import Buffer, BufferSection, SegmentWriter
from relayrl.buffer.config import RestartSection
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.restart import shortfall, stratified_order, stratum_of, update_mix
from relayrl.buffer.segments import GroupRef
from relayrl.buffer.testing import make_group

# Three kinds of task: short ones finish in seconds, long ones take most of an hour.
DURATION = {"short": 30.0, "mid": 300.0, "long": 3000.0}
STRATUM = {"short": "short|d0", "mid": "mid|d1", "long": "long|d2"}
RUNNING = {"short": 4, "mid": 2, "long": 2}  # per batch of 8 while the trainer runs


def config(**fields) -> BufferSection:
    base = dict(batch_groups=8, staleness={"max_staleness": 2}, restart={"rebalance_batches": 3})
    return msgspec.convert({**base, **fields}, BufferSection)


class Fleet:
    """Producers committing groups of the three kinds, with a shared clock for commit order."""

    def __init__(self, store):
        self.clock = itertools.count(1)
        self.writer = SegmentWriter(store, "rollout-0", groups_per_segment=1, clock=lambda: float(next(self.clock)))
        self.serial = itertools.count()

    def commit(self, kind: str, version: int) -> None:
        rewards = (0.0, 1.0, 0.0, 1.0)
        self.writer.add(make_group(f"{kind}-{next(self.serial)}", task_id=kind, version=version, rewards=rewards,
                                   duration_s=DURATION[kind], generated_tokens=16))


def kinds(batch) -> collections.Counter:
    return collections.Counter(group.group.task_id for group in batch.groups)


def train_steadily(store, fleet, buffer, steps):
    version = 0
    for _ in range(steps):
        for kind, count in RUNNING.items():
            for _ in range(count):
                fleet.commit(kind, version)
        buffer.poll()
        batch = buffer.next_batch(version)
        assert kinds(batch) == collections.Counter(RUNNING)
        version += 1
    return version, batch.state


def skewed_backlog(fleet, version):
    # While the trainer was down the fleet kept rolling out at the last published version: short
    # tasks finished over and over, long ones only a few times, and late.
    for index in range(60):
        fleet.commit("short", version)
        if index % 5 == 4:
            fleet.commit("mid", version)
        if index % 10 == 9:
            fleet.commit("long", version)  # 60 short, 12 mid, 6 long


def test_skewed_backlog_is_batched_in_the_running_mix_and_its_surplus_ages_out(store):
    fleet = Fleet(store)
    version, state = train_steadily(store, fleet, Buffer(store, config()), steps=5)
    assert state.mix == pytest.approx({STRATUM["short"]: 0.5, STRATUM["mid"]: 0.25, STRATUM["long"]: 0.25})
    skewed_backlog(fleet, version)  # the weights of the last step were published

    # Without the restart policy the first batches after the restart are nearly all short tasks.
    naive = Buffer(store, config())
    naive.restore(state, rebalance=False)
    naive.poll()
    naive_mix = sum((kinds(naive.next_batch(version + step)) for step in range(3)), collections.Counter())
    assert naive_mix == {"short": 20, "mid": 3, "long": 1}  # the running mix would be 12, 6, 6

    buffer = Buffer(store, config())
    buffer.restore(state)
    buffer.poll()
    assert buffer.rebalancing
    for step in range(3):
        batch = buffer.next_batch(version + step)
        assert batch.metrics.rebalanced and batch.metrics.rebalance_shortfall == 0
        assert kinds(batch) == collections.Counter(RUNNING), f"batch {step} after the restart"
        assert [g.ref for g in batch.groups] == sorted((g.ref for g in batch.groups), key=lambda r: r.sequence)
    assert not buffer.rebalancing
    assert batch.state.mix == state.mix  # re-balanced batches do not move the target

    # Three steps later the backlog is past the staleness bound: the surplus is dropped, counted.
    fresh_version = version + 3
    for kind, count in RUNNING.items():
        for _ in range(count):
            fleet.commit(kind, fresh_version)
    buffer.poll()
    batch = buffer.next_batch(fresh_version)
    assert kinds(batch) == collections.Counter(RUNNING) and not batch.metrics.rebalanced
    assert batch.metrics.dropped == {"stale": 60 + 12 + 6 - 24}
    assert buffer.pending == 0


def test_missing_long_tasks_are_replaced_in_proportion_and_the_shortfall_reported(store):
    fleet = Fleet(store)
    version, state = train_steadily(store, fleet, Buffer(store, config()), steps=2)
    for index in range(30):
        fleet.commit("short", version)
        if index % 3 == 0:
            fleet.commit("mid", version)
    fleet.commit("long", version)  # one long task finished during the outage
    buffer = Buffer(store, config())
    buffer.restore(state)
    buffer.poll()
    batch = buffer.next_batch(version)
    # The long stratum owed 2 places and had 1 group; the other 7 places go to short and mid as
    # close to their 2:1 ratio as whole groups allow (4.67 : 2.33), never to one stratum alone.
    assert kinds(batch) == {"short": 4, "mid": 3, "long": 1}
    assert batch.metrics.rebalance_shortfall == 1


def pending(task_id: str, duration: float, index: int, metadata=None) -> PendingGroup:
    group = make_group(f"{task_id}-{index}", task_id=task_id, duration_s=duration, generated_tokens=4,
                       metadata=metadata)
    return PendingGroup.from_group(GroupRef("p", 0, index), group, committed_at=float(index), ingested_at=0.0)


def test_stratum_is_task_and_duration_bucket_or_a_metadata_key():
    group = pending("swe-123", 700.0, 0, metadata={"family": "django"})
    assert stratum_of(group, RestartSection()) == "swe-123|d2"
    assert stratum_of(group, RestartSection(stratum="metadata:family", duration_buckets_s=(1000.0,))) == "django|d0"
    with pytest.raises(ValueError, match="buffer.restart.stratum"):
        stratum_of(group, RestartSection(stratum="family"))


def test_stratified_order_follows_the_mix_in_every_prefix():
    candidates = [("a", pending("a", 1, i)) for i in range(10)] + [("b", pending("b", 1, 10 + i)) for i in range(10)]
    candidates += [("new", pending("new", 1, 30))]
    ordered = stratified_order(candidates, {"a": 0.75, "b": 0.25})
    labels = [group.group.task_id for group in ordered]
    assert labels[:8] == ["a", "a", "b", "a", "a", "a", "b", "a"]
    for n in range(1, 14):  # while both strata last, every prefix is within one group of the mix
        assert abs(labels[:n].count("a") - 0.75 * n) < 1, labels[:n]
    assert labels[-1] == "new"  # strata outside the mix only fill what the mix cannot
    a_indices = [group.ref.index for group in ordered if group.group.task_id == "a"]
    assert a_indices == sorted(a_indices)  # commit order within a stratum


def test_running_mix_update_and_shortfall():
    mix = update_mix({}, ["a", "a", "b", "c"], decay=0.5)
    assert mix == {"a": 0.5, "b": 0.25, "c": 0.25}
    mix = update_mix(mix, ["a", "a", "a", "a"], decay=0.5)
    assert mix == {"a": 0.75, "b": 0.125, "c": 0.125}
    assert "b" not in update_mix({"a": 0.9999, "b": 0.0001}, ["a"], decay=0.5)  # forgotten below the floor
    assert shortfall(["a"] * 6 + ["b"] * 2, {"a": 0.5, "b": 0.5}) == 2
    assert shortfall(["a"] * 4 + ["b"] * 4, {"a": 0.5, "b": 0.5}) == 0
