"""The rollout manager end to end with a scripted model: groups graded, shaped, committed, decodable."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from relayrl.algo.length_penalty import AlternatingLengthPenalty, Phase
from relayrl.buffer import Buffer, Progress, PromptScheduler, SegmentWriter, read_progress, write_progress
from relayrl.core import codec, wire
from relayrl.core.store import open_store
from relayrl.core.wire import TaskSpec
from relayrl.rollout.agent import AgentConfig, CodingAgent, SingleTurn
from relayrl.rollout.environment import with_rewards
from relayrl.rollout.manager import RolloutManager
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing.scripted import CHAT, RecordingTools, ScriptedEngine, call


class IndexGrader:
    """Reward 1 for even sample indices: a deterministic stand-in for a sandbox grader."""

    async def grade(self, task, trajectories, answers):
        return [with_rewards(t, float(t.sample_index % 2 == 0), success=float(t.sample_index % 2 == 0))
                for t in trajectories]


def scripted_replies() -> list[str]:
    return [
        "look " + call("echo", text="a") + call("echo", text="b") + call("wait"),
        "more " + call("echo", text="c") + call("echo", text="d"),
        "again " + call("echo", text="e" * 40),
        "then " + call("echo", text="f" * 40),
        "still " + call("echo", text="g" * 40),
        "done",
    ]


def test_manager_commits_groups_whose_segments_hold_exactly_the_engine_tokens(tmp_path):
    config = AgentConfig(context_limit=900, summary_max_tokens=60, max_tokens_per_turn=200, system_prompt="sys",
                         compaction_prompt="Summarise now.")
    engine = ScriptedEngine(scripted_replies(), config.compaction_prompt, per_trajectory=True)
    store = open_store(str(tmp_path / "bus"))
    tools = RecordingTools()

    async def tools_factory(task):
        yield tools

    tasks = [TaskSpec(task_id="fix-calc", instruction="Fix the failing test in calc.py.")]
    shaper = AlternatingLengthPenalty(AlternatingLengthPenalty.Config(schedule=[Phase(kind="budget", steps=10)],
                                                                      budget=50.0, coefficient=0.2))
    manager = RolloutManager(
        scheduler=PromptScheduler(tasks, seed=0), harness=CodingAgent(config), proxy=TokenRecordingProxy(engine),
        chat=CHAT, sampling=SamplingParams(), grader=IndexGrader(),
        writer=SegmentWriter(store, "rollout-0", groups_per_segment=1), store=store,
        tools=contextlib.asynccontextmanager(tools_factory), shapers=[shaper], group_size=2, max_concurrent_groups=1)
    asyncio.run(manager.run(max_groups=2))
    assert manager.committed_groups == 2

    keys = store.list("rollouts/")
    assert len(keys) == 2
    segments = [codec.decode_compressed(store.get(key), wire.RolloutSegment, what=key) for key in keys]
    trajectories = [t for segment in segments for group in segment.groups for t in group.trajectories]
    assert len(trajectories) == 4
    # Every generated token in the committed segments, in order, is a token the engine emitted.
    committed_spans = sorted([list(span.token_ids()) for t in trajectories for span in t.generated_spans()])
    assert committed_spans == sorted(engine.emitted)
    for trajectory in trajectories:
        # A multi-turn trajectory with parallel tool calls and two compactions, whole on the bus.
        assert [segment.reason for segment in trajectory.segments] == ["start", "compaction", "compaction"]
        assert max(len(turn.tool_calls) for segment in trajectory.segments for turn in segment.turns) == 3
        success = trajectory.reward_components["success"]
        assert trajectory.reward == pytest.approx(0.8 if success else 0.0)  # shaped: budget phase, long
        assert trajectory.reward_components["length_penalty"] == pytest.approx(-0.2 if success else 0.0)
    assert tools.peak >= 3  # a turn's three calls ran together (two agents share this recorder)
    # The trainer side reads them back through the buffer.
    buffer = Buffer(store)
    buffer.poll()
    assert buffer.pending == 2


def test_back_pressure_waits_for_the_trainer(tmp_path):
    store = open_store(str(tmp_path / "bus"))
    engine = ScriptedEngine(["answer"] * 100, "unused")

    class Single:
        async def run(self, task, *, proxy, tools, chat, sampling, group_id, sample_index):
            from relayrl.rollout.agent import SingleTurn

            return await SingleTurn().run(task, proxy=proxy, tools=tools, chat=chat, sampling=sampling,
                                          group_id=group_id, sample_index=sample_index)

    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=Single(), proxy=TokenRecordingProxy(engine), chat=CHAT,
                             sampling=SamplingParams(), grader=IndexGrader(),
                             writer=SegmentWriter(store, "rollout-1", groups_per_segment=1), store=store,
                             group_size=2, max_concurrent_groups=1, max_ahead_groups=2, progress_poll_s=0.01)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        await asyncio.sleep(0.5)
        ahead_before = manager.committed_groups
        write_progress(store, Progress(step=1, version=1, consumed={"rollout-1": 2}))  # the trainer catches up
        await asyncio.sleep(0.5)
        manager.stop()
        await runner
        return ahead_before

    ahead_before = asyncio.run(scenario())
    assert ahead_before == 3  # stopped once more than 2 groups ahead
    assert manager.committed_groups == 5  # two more after the trainer consumed two
    assert read_progress(store).consumed == {"rollout-1": 2}


@pytest.mark.parametrize("synchronous", [False, True])
def test_a_restarted_producer_keeps_its_lead_limit(tmp_path, synchronous):
    """A producer that restarts counts its groups from zero while the trainer has consumed many of its
    predecessor's: neither mode may take that difference for room to run ahead."""
    store = open_store(str(tmp_path / "bus"))
    write_progress(store, Progress(step=5, version=6, consumed={"rollout-r": 40}))  # the predecessor's groups
    engine = ScriptedEngine(["answer"] * 1000, "unused", version=6)

    async def served_version():
        return engine.version

    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(engine), chat=CHAT,
                             sampling=SamplingParams(), grader=IndexGrader(),
                             writer=SegmentWriter(store, "rollout-r", groups_per_segment=1), store=store,
                             group_size=2, max_concurrent_groups=1, max_ahead_groups=2, progress_poll_s=0.01,
                             synchronous_batch=3 if synchronous else 0, served_version=served_version)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        await asyncio.sleep(0.5)
        manager.stop()
        await runner

    asyncio.run(scenario())
    assert manager.committed_groups == 3  # one batch; or the lead limit (2) plus the group that crossed it


def test_a_fleet_held_back_commits_its_open_segment_so_the_trainer_can_catch_up(tmp_path):
    # Segments of 4 groups, a lead of 2: without committing the partial segment while it waits, the
    # fleet would hold 3 groups the trainer cannot see and both would wait forever.
    store = open_store(str(tmp_path / "bus"))
    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(),
                             proxy=TokenRecordingProxy(ScriptedEngine(["answer"] * 100, "unused")), chat=CHAT,
                             sampling=SamplingParams(), grader=IndexGrader(),
                             writer=SegmentWriter(store, "rollout-2", groups_per_segment=4), store=store,
                             group_size=2, max_concurrent_groups=1, max_ahead_groups=2, progress_poll_s=0.01)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        await asyncio.sleep(0.5)
        visible = Buffer(store).poll()  # what a trainer sees while the fleet waits
        manager.stop()
        await runner
        return visible

    assert asyncio.run(scenario()) == 3 == manager.committed_groups  # all three it holds, in a partial segment


class SecondGroupTies(IndexGrader):
    """IndexGrader, except that the second group graded earns the same reward everywhere (zero variance)."""

    def __init__(self) -> None:
        self.graded = 0

    async def grade(self, task, trajectories, answers):
        self.graded += 1
        if self.graded == 2:
            return [with_rewards(t, 1.0, success=1.0) for t in trajectories]
        return await super().grade(task, trajectories, answers)


def test_synchronous_mode_generates_one_batch_with_the_trainers_weights_then_waits(tmp_path):
    store = open_store(str(tmp_path / "bus"))
    engine = ScriptedEngine(["answer"] * 1000, "unused", version=1)

    async def served_version():
        return engine.version

    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(engine), chat=CHAT,
                             sampling=SamplingParams(), grader=SecondGroupTies(),
                             writer=SegmentWriter(store, "rollout-s", groups_per_segment=8), store=store,
                             group_size=2, max_concurrent_groups=8, progress_poll_s=0.01, skip_zero_variance=True,
                             synchronous_batch=3, served_version=served_version)
    seen = []

    async def scenario():
        runner = asyncio.create_task(manager.run())
        await asyncio.sleep(0.5)
        seen.append((manager.committed_groups, manager.graded_groups, Buffer(store).poll()))
        # The trainer trains on the batch and publishes version 2; the engine still serves version 1.
        write_progress(store, Progress(step=1, version=2, consumed={"rollout-s": 3}))
        await asyncio.sleep(0.5)
        seen.append((manager.committed_groups, manager.graded_groups))
        engine.version = 2
        await asyncio.sleep(0.5)
        seen.append((manager.committed_groups, manager.graded_groups))
        manager.stop()
        await runner

    asyncio.run(scenario())
    # Exactly one batch (the zero-variance group replaced, by more than one group: over-provisioned for
    # the share seen so far; the surplus is dropped, never committed), committed whole; no group while
    # the engine serves older weights than the trainer's; then exactly the next batch.
    (committed, graded, buffered), waiting = seen[:2]
    assert (committed, buffered) == (3, 3) and graded >= 4 and waiting == (3, graded)
    assert seen[2][0] == 6   # and stop() ended it cleanly
    segments = [codec.decode_compressed(store.get(key), wire.RolloutSegment, what=key) for key in store.list("rollouts/")]
    versions = [group.trajectories[0].policy_version_range() for segment in segments for group in segment.groups]
    assert versions == [(1, 1)] * 3 + [(2, 2)] * 3  # every group sampled by the trainer's current weights


def test_synchronous_mode_puts_the_whole_batch_in_flight_for_the_share_it_will_commit(tmp_path):
    """Half the groups tie (zero variance, not committed): once that share is known a batch of 4 starts
    about 8 groups at once (one round of generation, not several), and commits exactly 4."""

    class HalfTie(IndexGrader):
        def __init__(self) -> None:
            self.graded, self.running, self.most_running = 0, 0, 0

        async def grade(self, task, trajectories, answers):
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            await asyncio.sleep(0.05)
            self.running -= 1
            self.graded += 1
            if self.graded % 2:
                return [with_rewards(t, 1.0, success=1.0) for t in trajectories]
            return await super().grade(task, trajectories, answers)

    store = open_store(str(tmp_path / "bus"))
    grader = HalfTie()
    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(ScriptedEngine(["a"] * 1000, "unused")),
                             chat=CHAT, sampling=SamplingParams(), grader=grader,
                             writer=SegmentWriter(store, "rollout-h", groups_per_segment=8), store=store,
                             group_size=2, max_concurrent_groups=16, progress_poll_s=0.01, skip_zero_variance=True,
                             synchronous_batch=4)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        for step in range(1, 4):
            while manager.committed_groups < 4 * step:
                await asyncio.sleep(0.01)
            grader.most_running = 0
            write_progress(store, Progress(step=step, version=0, consumed={"rollout-h": 4 * step}))
        while manager.committed_groups < 16:
            await asyncio.sleep(0.01)
        manager.stop()
        await runner

    asyncio.run(scenario())
    assert manager.committed_groups == 16 and Buffer(store).poll() is not None
    assert grader.most_running >= 7, f"only {grader.most_running} groups graded at once for a batch of 4 at half ties"


def test_the_synchronous_mode_starts_enough_groups_to_fill_its_batch_in_one_round_nine_times_in_ten():
    from relayrl.rollout.manager import fewest_for_one_round

    # P(Binomial(12, 1/2) >= 4) = 0.927, P(Binomial(11, 1/2) >= 4) = 0.887.
    assert fewest_for_one_round(4, 0.5, 16) == 12
    assert fewest_for_one_round(8, 1.0, 32) == 8  # every group commits: no more than the batch
    assert fewest_for_one_round(8, 0.3, 32) == 32 and fewest_for_one_round(8, 0.3, 64) == 37  # capped by the fleet
    assert fewest_for_one_round(0, 0.5, 16) == 0
    simulated = random.Random(0)
    for room, share in ((8, 0.3), (16, 0.7), (3, 0.05)):
        count = fewest_for_one_round(room, share, 4096)
        filled = sum(sum(simulated.random() < share for _ in range(count)) >= room for _ in range(2000))
        assert filled / 2000 + 0.02 >= 0.9, (room, share, count)
        fewer = sum(sum(simulated.random() < share for _ in range(count - 1)) >= room for _ in range(2000))
        assert fewer / 2000 < 0.9 + 0.02, (room, share, count)  # the fewest: one less is not enough


def test_synchronous_mode_stops_cleanly_with_a_batch_in_flight(tmp_path):
    class SlowGrader(IndexGrader):
        async def grade(self, task, trajectories, answers):
            await asyncio.sleep(5)
            return await super().grade(task, trajectories, answers)

    store = open_store(str(tmp_path / "bus"))
    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(ScriptedEngine(["a"] * 100, "unused")),
                             chat=CHAT, sampling=SamplingParams(), grader=SlowGrader(),
                             writer=SegmentWriter(store, "rollout-t", groups_per_segment=8), store=store,
                             group_size=2, max_concurrent_groups=8, progress_poll_s=0.01, synchronous_batch=3)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        await asyncio.sleep(0.3)
        manager.stop()
        await asyncio.wait_for(runner, 3)  # no error, and no waiting for the groups being graded

    asyncio.run(scenario())
    assert manager.committed_groups == 0 and not store.list("rollouts/")


def test_sigterm_stops_cleanly_with_nothing_half_committed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("manager_process.py")
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path / "bus")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert process.stdout.readline().strip() == "READY", process.stderr.read()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, process.stderr.read()
    store = open_store(str(tmp_path / "bus"))
    groups = [group for key in store.list("rollouts/")
              for group in codec.decode_compressed(store.get(key), wire.RolloutSegment, what=key).groups]
    assert groups, "the group committed before SIGTERM is on the bus"
    for group in groups:  # every committed group is whole and graded
        assert len(group.trajectories) == 3
        assert [t.reward for t in sorted(group.trajectories, key=lambda t: t.sample_index)] == [1.0, 0.0, 0.0]
        assert all(t.num_generated_tokens == len("a fairly long answer") + 1 for t in group.trajectories)


class ConstantGrader:
    """Every sample of the first task earns 1, of the others 0 for odd sample indices."""

    async def grade(self, task, trajectories, answers):
        return [with_rewards(t, 1.0 if task.task_id == "same" else float(t.sample_index % 2 == 0)) for t in trajectories]


def test_zero_variance_groups_are_counted_but_not_committed(tmp_path):
    from relayrl.buffer import read_fleet_counters, write_fleet_counters

    store = open_store(str(tmp_path / "bus"))
    tasks = [TaskSpec(task_id="same", instruction="a"), TaskSpec(task_id="mixed", instruction="b")]
    manager = RolloutManager(
        scheduler=PromptScheduler(tasks, seed=0), harness=SingleTurn(), proxy=TokenRecordingProxy(
            ScriptedEngine(["x"] * 8, "summarise")), chat=CHAT, sampling=SamplingParams(), grader=ConstantGrader(),
        writer=SegmentWriter(store, "rollout-0", groups_per_segment=1), store=store, group_size=2,
        max_concurrent_groups=1, skip_zero_variance=True)
    asyncio.run(manager.run(max_groups=4))
    assert (manager.graded_groups, manager.committed_groups, manager.skipped_groups) == (4, 2, 2)
    assert len(store.list("rollouts/")) == 2
    write_fleet_counters(store, "rollout-0", manager.fleet_counters())
    counters = read_fleet_counters(store)["rollout-0"]
    assert counters.reward_count == 8 and counters.reward_sum == 6  # 2x(1+1) + 2x(1+0)
    assert manager.metrics()["fleet/zero_variance_skipped"] == 2


class FlakyGrader(IndexGrader):
    """Fails every third group, as a sandbox that cannot start would."""

    def __init__(self):
        self.calls = 0

    async def grade(self, task, trajectories, answers):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("cannot set up the sandbox")
        return await super().grade(task, trajectories, answers)


def test_a_group_whose_grading_fails_is_counted_and_reported_and_the_fleet_goes_on(tmp_path, capfd):
    store = open_store(str(tmp_path / "bus"))
    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(ScriptedEngine(["answer"] * 100, "unused")),
                             chat=CHAT, sampling=SamplingParams(), grader=FlakyGrader(),
                             writer=SegmentWriter(store, "rollout-0", groups_per_segment=1), store=store,
                             group_size=2, max_concurrent_groups=1, max_ahead_groups=100, progress_poll_s=0.01)

    async def scenario():
        runner = asyncio.create_task(manager.run())
        while manager.committed_groups < 6:
            await asyncio.sleep(0.01)
        manager.stop()
        await runner

    asyncio.run(asyncio.wait_for(scenario(), 30))
    # Six groups graded took at least eight grading calls, the third and sixth of which failed; a fast
    # fleet may get further before stop() lands, so only the lower bound is certain.
    assert manager.failed_groups >= 2 and manager.metrics()["fleet/groups_failed"] == manager.failed_groups
    err = capfd.readouterr().err
    assert err.count("rollout: a group failed") == 1, err   # once per 10 s, not once per group
    assert "RuntimeError: cannot set up the sandbox" in err
    assert "exception was never retrieved" not in err


class GroupCountingEngine(ScriptedEngine):
    """A scripted engine that records the size of every group call it gets."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group_sizes: list[int] = []

    def stream_group(self, requests):
        self.group_sizes.append(len(requests))
        return super().stream_group(requests)


def test_a_groups_samples_open_their_tools_first_and_send_their_first_turns_as_one_call(tmp_path):
    """Sandboxes that take different times to open: every sample's tools open first, so the four first
    turns (one prompt) still reach the engine as one group call."""
    engine = GroupCountingEngine(["done"] * 8, "unused", per_trajectory=True)
    opened = iter([0.04, 0.0, 0.02, 0.01])

    @contextlib.asynccontextmanager
    async def slow_tools(task):
        await asyncio.sleep(next(opened))
        yield RecordingTools()

    manager = RolloutManager(
        scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
        harness=CodingAgent(AgentConfig(system_prompt="sys")), proxy=TokenRecordingProxy(engine), chat=CHAT,
        sampling=SamplingParams(), grader=IndexGrader(),
        writer=SegmentWriter(open_store(str(tmp_path / "bus")), "rollout-g", groups_per_segment=1),
        tools=slow_tools, group_size=4, max_concurrent_groups=1)
    asyncio.run(manager.run(max_groups=1))
    assert engine.group_sizes == [4] and manager.committed_groups == 1


def test_a_sandbox_that_fails_to_open_fails_its_group_and_closes_the_ones_that_opened(tmp_path):
    states: list[str] = []
    attempts = iter([None, RuntimeError("no sandbox for you"), None])

    @contextlib.asynccontextmanager
    async def tools(task):
        failure = next(attempts)
        await asyncio.sleep(0.01)
        if failure is not None:
            raise failure
        states.append("open")
        try:
            yield RecordingTools()
        finally:
            states.append("closed")

    manager = RolloutManager(
        scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0), harness=SingleTurn(),
        proxy=TokenRecordingProxy(ScriptedEngine(["a"] * 10, "unused")), chat=CHAT, sampling=SamplingParams(),
        grader=IndexGrader(), writer=SegmentWriter(open_store(str(tmp_path / "bus")), "rollout-f", groups_per_segment=1),
        tools=tools, group_size=3)
    with pytest.raises(RuntimeError, match="no sandbox for you"):
        asyncio.run(manager.run_group(TaskSpec(task_id="t", instruction="q")))
    assert states == ["open", "open", "closed", "closed"]
