"""Conformance suites for buffer plugins: subclass one and override its fixtures only.

Example::

    from relayrl.buffer.testing import AdmissionPolicyTests

    class TestMinReward(AdmissionPolicyTests):
        @pytest.fixture
        def policy(self):
            return MinRewardPolicy(0.5)
"""

from __future__ import annotations

import pytest

from relayrl.buffer.admission import Admission
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.segments import GroupRef
from relayrl.buffer.testing.groups import make_group
from relayrl.core import codec


def _pending(group, index: int = 0) -> PendingGroup:
    return PendingGroup.from_group(GroupRef("producer-0", 0, index), group, committed_at=1.0, ingested_at=2.0)


class AdmissionPolicyTests:
    """Contract of an admission policy: valid, deterministic verdicts without side effects."""

    @pytest.fixture
    def policy(self):
        raise NotImplementedError("override the `policy` fixture to return the policy under test")

    @pytest.fixture
    def groups(self) -> list[PendingGroup]:
        """Varied groups: fresh and stale, mixed and uniform rewards, one without generated tokens."""
        specs = [
            dict(rewards=(0.0, 1.0, 1.0, 0.0), version=10), dict(rewards=(1.0, 1.0), version=10),
            dict(rewards=(0.0, 0.5), version=(2, 9)), dict(rewards=(0.0,), version=0),
            dict(rewards=(0.2, 0.9, 0.4), version=12), dict(rewards=(0.0, 1.0), version=5, generated_tokens=0),
        ]
        return [_pending(make_group(f"g{index}", **spec), index) for index, spec in enumerate(specs)]

    @pytest.mark.parametrize("trainer_version", [0, 10, 11, 40])
    def test_verdicts_are_valid(self, policy, groups, trainer_version):
        for group in groups:
            verdict = policy.admit(group, trainer_version)
            assert isinstance(verdict, Admission), f"{group.ref}: {verdict!r} is not an Admission"
            if verdict.dropped:
                assert verdict.drop_reason and " " not in verdict.drop_reason, f"drop reason {verdict.drop_reason!r}"
            else:
                assert 0.0 < verdict.weight <= 1.0, f"{group.ref}: weight {verdict.weight}"
                assert verdict.weight == 1.0 or verdict.weight_reason, f"{group.ref}: down-weighted without a reason"

    def test_verdicts_are_deterministic_and_leave_the_group_alone(self, policy, groups):
        before = [codec.encode(group.group) for group in groups]
        first = [policy.admit(group, 11) for group in groups]
        second = [policy.admit(group, 11) for group in reversed(groups)][::-1]
        assert first == second
        assert [codec.encode(group.group) for group in groups] == before


class PromptSchedulerTests:
    """Contract of a prompt scheduler: seeded order, checkpointable state, picks from the task list."""

    @pytest.fixture
    def make_scheduler(self):
        """A function ``(tasks, seed) -> scheduler``."""
        raise NotImplementedError("override the `make_scheduler` fixture")

    @pytest.fixture
    def tasks(self) -> list[str]:
        return [f"task-{index:03d}" for index in range(23)]

    def _run(self, scheduler, steps: int) -> list[str]:
        picks = []
        for step in range(steps):
            pick = scheduler.next()
            picks.append(pick.task_id)
            scheduler.observe(make_group(f"g{step}", task_id=pick.task_id,
                                         rewards=(1.0, 0.0, 0.0, 0.0) if step % 3 else (1.0, 1.0, 1.0, 1.0)))
        return picks

    def test_same_seed_same_order_other_seed_other_order(self, make_scheduler, tasks):
        first = self._run(make_scheduler(tasks, 7), 60)
        assert first == self._run(make_scheduler(tasks, 7), 60)
        assert first != self._run(make_scheduler(tasks, 8), 60)
        assert set(first) <= set(tasks)

    def test_restored_state_continues_the_same_sequence(self, make_scheduler, tasks):
        reference = self._run(make_scheduler(tasks, 3), 80)
        scheduler = make_scheduler(tasks, 3)
        head = self._run(scheduler, 37)
        resumed = make_scheduler(tasks, 3)
        resumed.restore(scheduler.state())
        # A different step offset would change the rewards observed; replay the same pattern.
        tail = []
        for step in range(37, 80):
            pick = resumed.next()
            tail.append(pick.task_id)
            resumed.observe(make_group(f"g{step}", task_id=pick.task_id,
                                       rewards=(1.0, 0.0, 0.0, 0.0) if step % 3 else (1.0, 1.0, 1.0, 1.0)))
        assert head + tail == reference
