"""PromptScheduler: seeded epochs, pass-rate estimates, the difficulty band with re-tests, state, registry."""

from __future__ import annotations

import collections

import msgspec
import pytest

from relayrl.buffer.config import PromptsSection
from relayrl.buffer.hookspecs import PROMPT_SCHEDULERS
from relayrl.buffer.prompts import PromptScheduler, PromptSchedulerState, create_prompt_scheduler
from relayrl.buffer.testing import PromptSchedulerTests, make_group
from relayrl.core import wire
from relayrl.core.errors import PluginError, WireError
from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl

TASKS = [f"task-{index:02d}" for index in range(20)]
FILTERED = PromptsSection(difficulty_filter=True, band=(0.05, 0.5), retest_rate=0.1, min_samples=8,
                          estimate_decay=1.0)


def test_each_epoch_is_a_seeded_permutation_of_all_tasks():
    scheduler = PromptScheduler(TASKS, seed=11)
    epochs = [[scheduler.next().task_id for _ in TASKS] for _ in range(3)]
    assert all(sorted(epoch) == TASKS for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert scheduler.state().epoch == 2 and scheduler.state().position == len(TASKS)


def test_task_specs_are_scheduled_as_themselves():
    specs = [wire.TaskSpec(task_id=f"t{index}", instruction="fix it") for index in range(3)]
    pick = PromptScheduler(specs).next()
    assert pick.task in specs and pick.task_id == pick.task.task_id and pick.reason == "eligible"


def test_pass_rate_needs_min_samples_and_follows_the_policy_with_decay():
    scheduler = PromptScheduler(TASKS, PromptsSection(min_samples=8, estimate_decay=0.5))
    scheduler.observe(make_group("g0", task_id="task-00", rewards=(1.0, 0.0, 0.0, 0.0)))
    assert scheduler.pass_rate("task-00") is None  # 4 samples < 8
    scheduler.observe(make_group("g1", task_id="task-00", rewards=(1.0, 1.0, 1.0, 1.0)))
    # decayed: passes 1 * 0.5 + 4, attempts 4 * 0.5 + 4
    assert scheduler.pass_rate("task-00") == pytest.approx(4.5 / 6.0)
    assert scheduler.pass_rate("task-99") is None


def test_success_threshold_decides_what_a_pass_is():
    scheduler = PromptScheduler(TASKS, PromptsSection(min_samples=1, success_threshold=0.9))
    scheduler.observe(make_group("g", task_id="task-00", rewards=(0.95, 0.5, 0.89, 1.0)))
    assert scheduler.pass_rate("task-00") == 0.5


def observe_rates(scheduler, rates: dict[str, float], samples: int = 16):
    for task_id, rate in rates.items():
        passes = round(rate * samples)
        scheduler.observe_counts(task_id, passes, samples)


def test_difficulty_band_keeps_low_but_nonzero_pass_rates_and_retests_the_rest():
    scheduler = PromptScheduler(TASKS, FILTERED, seed=5)
    # Tasks 0-4 always solved, 5-9 never solved, 10-14 solved 1/4 of the time; 15-19 unknown.
    observe_rates(scheduler, {f"task-{i:02d}": 1.0 for i in range(5)})
    observe_rates(scheduler, {f"task-{i:02d}": 0.0 for i in range(5, 10)})
    observe_rates(scheduler, {f"task-{i:02d}": 0.25 for i in range(10, 15)})
    picks = [scheduler.next() for _ in range(400)]
    by_reason = collections.defaultdict(collections.Counter)
    for pick in picks:
        by_reason[pick.reason][int(pick.task_id[-2:]) // 5] += 1
    assert set(by_reason["eligible"]) == {2} and set(by_reason["unknown"]) == {3}
    assert set(by_reason["retest"]) <= {0, 1} and sum(by_reason["retest"].values()) > 0
    excluded_turns = sum(by_reason["retest"].values()) + scheduler.state().skipped
    assert 0.02 < sum(by_reason["retest"].values()) / excluded_turns < 0.25  # about retest_rate = 0.1
    assert scheduler.metrics()["prompts/tasks_in_band"] == 5 and scheduler.metrics()["prompts/tasks_out_of_band"] == 10


def test_an_excluded_task_comes_back_once_its_retests_show_it_in_the_band():
    scheduler = PromptScheduler(["hard", "other"], FILTERED, seed=1)
    observe_rates(scheduler, {"hard": 0.0, "other": 0.25})
    for _ in range(400):
        pick = scheduler.next()
        if pick.task_id == "hard":
            assert pick.reason in ("retest", "eligible")
            # The policy has learned to solve it sometimes: each re-test now passes 1 of 4.
            scheduler.observe(make_group(f"g{_}", task_id="hard", rewards=(1.0, 0.0, 0.0, 0.0)))
            if pick.reason == "eligible":
                break
    else:
        pytest.fail("the re-tested task never came back into the band")
    assert scheduler.in_band("hard")


def test_when_every_task_is_excluded_one_is_forced_rather_than_spinning():
    scheduler = PromptScheduler(["a", "b"], PromptsSection(difficulty_filter=True, retest_rate=0.0, min_samples=1))
    observe_rates(scheduler, {"a": 1.0, "b": 1.0})
    assert {scheduler.next().reason for _ in range(5)} == {"forced"}


def test_state_round_trips_through_msgpack_and_builtins():
    scheduler = PromptScheduler(TASKS, FILTERED, seed=2)
    observe_rates(scheduler, {"task-03": 0.25})
    for _ in range(7):
        scheduler.next()
    state = scheduler.state()
    continuation = [scheduler.next() for _ in range(30)]
    for form in (msgspec.msgpack.encode(state), msgspec.to_builtins(state)):
        other = PromptScheduler(TASKS, FILTERED, seed=2)
        other.restore(form)
        assert other.state() == state
        assert [other.next() for _ in range(30)] == continuation
    with pytest.raises(WireError, match="prompt scheduler state"):
        PromptScheduler(TASKS).restore({"epoch": "x"})


def test_state_is_a_snapshot():
    scheduler = PromptScheduler(TASKS, seed=2)
    scheduler.observe_counts("task-01", 1, 4)
    before = scheduler.state()
    scheduler.observe_counts("task-01", 4, 4)
    scheduler.next()
    assert before.stats["task-01"].passes == 1 and before.position == 0
    assert scheduler.state().stats["task-01"].attempts == pytest.approx(4 * 0.95 + 4)


def test_bad_configuration_is_refused_by_name():
    with pytest.raises(ValueError, match="band"):
        PromptScheduler(TASKS, PromptsSection(band=(0.6, 0.1)))
    with pytest.raises(ValueError, match="empty"):
        PromptScheduler([])
    with pytest.raises(ValueError, match="duplicate task ids"):
        PromptScheduler(["a", "a"])


class Cycle:
    """A third-party scheduler: every task in turn, no filtering."""

    def __init__(self, tasks, config, *, seed):
        self.tasks, self.position = list(tasks), seed % len(tasks)

    def next(self):
        from relayrl.buffer.prompts import Pick

        task = self.tasks[self.position % len(self.tasks)]
        self.position += 1
        return Pick(task, task, "eligible")

    def observe(self, group):
        pass

    def state(self):
        return {"position": self.position}

    def restore(self, state):
        self.position = state["position"]


class CyclePlugin:
    @hookimpl
    def relayrl_buffer_prompt_schedulers(self):
        yield Registration("cycle", Cycle, "every task in turn")


def test_registry_builds_the_configured_scheduler():
    pm = create_plugin_manager(plugins=[("relayrl-cycle", CyclePlugin())])
    assert sorted(PROMPT_SCHEDULERS.registrations(pm)) == ["cycle", "pass-rate"]
    assert isinstance(create_prompt_scheduler(TASKS, PromptsSection(), seed=1, pm=pm), PromptScheduler)
    cycle = create_prompt_scheduler(TASKS, PromptsSection(scheduler="cycle"), seed=1, pm=pm)
    assert cycle.next().task_id == "task-01"
    with pytest.raises(PluginError, match="unknown prompt scheduler 'nope'"):
        create_prompt_scheduler(TASKS, PromptsSection(scheduler="nope"), pm=pm)


class TestPassRateSchedulerConformance(PromptSchedulerTests):
    @pytest.fixture(params=[False, True], ids=["unfiltered", "filtered"])
    def make_scheduler(self, request):
        config = PromptsSection(difficulty_filter=request.param, min_samples=4)
        return lambda tasks, seed: PromptScheduler(tasks, config, seed=seed)


class TestPluginSchedulerConformance(PromptSchedulerTests):
    @pytest.fixture
    def make_scheduler(self):
        return lambda tasks, seed: Cycle(tasks, None, seed=seed)


def test_state_type_is_exported():
    assert PromptSchedulerState().epoch == 0
