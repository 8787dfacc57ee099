"""``RewardShaperTests`` and ``MonitorTests``: the conformance suites of reward shapers and health
monitors, built in or plugin.

Subclass one and override its fixture::

    from relayrl.algo.testing import MonitorTests, RewardShaperTests

    class TestMyShaper(RewardShaperTests):
        @pytest.fixture
        def shaper(self):
            return MyShaper(MyShaper.Config(budget=40))   # small enough that the groups below meet it

    class TestMyMonitor(MonitorTests):
        @pytest.fixture
        def make_monitor(self):
            return lambda: MyMonitor(MonitorsSection())

A shaper changes rewards and nothing else: the group comes back with the same trajectories in the
same order, tokens untouched, rewards finite, each change recorded in ``reward_components``, the
input left as it was; and it is a function of the group and the step alone (it has no state to
checkpoint, so a resumed trainer shapes exactly as an uninterrupted one). ``RewardShaperTests.groups``
are scored groups of varied length, turns and tool time; ``steps`` covers several schedule phases.

A monitor's outputs are finite metrics and :class:`~relayrl.algo.monitors.Alarm` records; it leaves
its inputs alone, ignores metrics it does not watch, and its ``state()`` survives the checkpoint's
encoding: a monitor restored from it mid-run observes exactly what an uninterrupted one does. A jump
after a steady stretch must raise an alarm. ``MonitorTests.stream`` is a default stream holding
every metric the built-in monitors watch and texts that turn from plain to "okay okay" phrasing;
override it for a monitor that watches something else.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from relayrl.core.wire import GeneratedSpan, Group, ToolCall, ToolResult, Trajectory, TrajectorySegment, Turn

__all__ = ["MonitorTests", "RewardShaperTests", "monitor_stream", "scored_groups"]


def _trajectory(group: int, sample: int, rng: random.Random) -> Trajectory:
    turns: list[Turn] = [Turn(role="user", text="fix it")]
    for turn in range(rng.randint(1, 4)):
        length = rng.choice([2, 5, 20, 60])
        span = GeneratedSpan.build([rng.randrange(1, 50) for _ in range(length)], [-0.5] * length, 0)
        calls = [ToolCall(id=f"c{turn}", name="bash", arguments={"command": "ls"})] if rng.random() < 0.6 else []
        turns.append(Turn(role="assistant", generated=span, tool_calls=calls))
        if calls:
            turns.append(Turn(role="tool", tool_results=[ToolResult(call_id=calls[0].id, output="a.py",
                                                                    wall_time_s=rng.choice([0.0, 0.5, 3.0]))]))
    reward = float(rng.random() < 0.5)
    return Trajectory(trajectory_id=f"g{group}-s{sample}", task_id=f"task-{group}", group_id=f"g{group}",
                      sample_index=sample, segments=[TrajectorySegment(turns=turns)], reward=reward,
                      reward_components={"success": reward})


def scored_groups(count: int = 6, size: int = 4, seed: int = 0) -> list[Group]:
    """Scored groups of varied generated length (2 to 240 tokens), turns, tool calls and tool time."""
    rng = random.Random(seed)
    return [Group(group_id=f"g{group}", task_id=f"task-{group}",
                  trajectories=[_trajectory(group, sample, rng) for sample in range(size)]) for group in range(count)]


def _encoded(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


class RewardShaperTests:
    """Conformance suite for reward shapers (``shaper(group, *, step) -> Group`` and ``metrics(step)``)."""

    steps: tuple[int, ...] = (0, 1, 7, 50, 99, 100, 120, 149, 150, 151, 400, 1000)
    """Trainer steps the suite shapes at: override to cover your shaper's schedule."""

    @pytest.fixture
    def shaper(self):
        raise NotImplementedError("override the `shaper` fixture to return the shaper under test")

    @pytest.fixture
    def groups(self) -> list[Group]:
        return scored_groups()

    def test_only_rewards_and_their_components_change(self, shaper, groups) -> None:
        for step in self.steps:
            for group in groups:
                shaped = shaper(group, step=step)
                assert isinstance(shaped, Group)
                assert (shaped.group_id, shaped.task_id) == (group.group_id, group.task_id)
                assert [t.trajectory_id for t in shaped.trajectories] == [t.trajectory_id for t in group.trajectories]
                for before, after in zip(group.trajectories, shaped.trajectories, strict=True):
                    assert _encoded(after.segments) == _encoded(before.segments), "a shaper changed the tokens"
                    assert after.cheating == before.cheating and after.status == before.status
                    assert math.isfinite(after.reward), f"step {step}: reward {after.reward}"
                    assert all(math.isfinite(value) for value in after.reward_components.values())

    def test_every_change_is_recorded_in_the_reward_components(self, shaper, groups) -> None:
        changed = 0
        for step in self.steps:
            for group in groups:
                for before, after in zip(group.trajectories, shaper(group, step=step).trajectories, strict=True):
                    if after.reward != before.reward:
                        changed += 1
                        assert after.reward_components != before.reward_components, \
                            f"{after.trajectory_id} at step {step}: reward changed, components did not"
        if changed == 0:
            pytest.fail("the shaper changed no reward on the suite's groups and steps: give the `shaper` fixture "
                        "settings (or `steps`) under which it acts, or the suite proves nothing")

    def test_the_input_group_is_left_as_it_was(self, shaper, groups) -> None:
        for step in self.steps:
            for group in groups:
                before = _encoded(group)
                shaper(group, step=step)
                assert _encoded(group) == before, "the shaper changed its input group in place"

    def test_a_group_is_shaped_by_itself_and_the_step_alone(self, shaper, groups) -> None:
        """No hidden state: a resumed trainer (a fresh shaper, groups in another order) shapes alike."""
        forward = {(step, group.group_id): _encoded(shaper(group, step=step))
                   for step in self.steps for group in groups}
        backward = {(step, group.group_id): _encoded(shaper(group, step=step))
                    for step in reversed(self.steps) for group in reversed(groups)}
        assert forward == backward

    def test_metrics_are_finite_floats(self, shaper) -> None:
        for step in self.steps:
            metrics = shaper.metrics(step)
            assert isinstance(metrics, dict)
            for key, value in metrics.items():
                assert isinstance(key, str) and isinstance(value, float) and math.isfinite(value), (key, value)


def monitor_stream(steady: int = 40, jump: int = 6, seed: int = 0) -> list[tuple[dict[str, float], list[str]]]:
    """(metrics, texts) per step: ``steady`` steps of noisy but stable values, then ``jump`` steps where
    every value moves far (entropy falls, the rest rise) and the texts open with "okay okay"."""
    rng = random.Random(seed)
    base = {"entropy/token_mean": 1.5, "mismatch/kl_k3": 0.001, "loss/clip_fraction": 0.02,
            "response/tokens_mean": 120.0, "response/turns_mean": 3.0, "response/tool_calls_per_turn": 0.8}
    stream = []
    for step in range(steady + jump):
        jumped = step >= steady
        metrics = {key: value * (1 + rng.uniform(-0.02, 0.02)) * (1.0 if not jumped else 0.1 if key.startswith(
            "entropy") else 10.0) for key, value in base.items()}
        metrics["unwatched/anything"] = rng.random()
        texts = ["okay okay, wait" if jumped else "Let me read the file first." for _ in range(8)]
        stream.append((metrics, texts))
    return stream


class MonitorTests:
    """Conformance suite for health monitors (``observe``, ``state``, ``restore``)."""

    @pytest.fixture
    def make_monitor(self) -> Callable[[], Any]:
        raise NotImplementedError("override the `make_monitor` fixture to return a factory of fresh monitors")

    @pytest.fixture
    def stream(self) -> list[tuple[dict[str, float], list[str]]]:
        return monitor_stream()

    @staticmethod
    def _outputs(monitor: Any, stream: list[tuple[dict[str, float], list[str]]], start: int = 0) -> list[bytes]:
        outputs = []
        for step, (metrics, texts) in enumerate(stream[start:], start):
            new_metrics, alarms = monitor.observe(step, dict(metrics), list(texts))
            outputs.append(_encoded([sorted(new_metrics.items()), [repr(alarm) for alarm in alarms]]))
        return outputs

    def test_outputs_are_finite_metrics_and_alarms(self, make_monitor, stream) -> None:
        from relayrl.algo.monitors import Alarm

        monitor = make_monitor()
        assert isinstance(monitor.name, str) and monitor.name, "a monitor's name keys its checkpointed state"
        for step, (metrics, texts) in enumerate(stream):
            new_metrics, alarms = monitor.observe(step, metrics, texts)
            assert all(isinstance(key, str) and math.isfinite(value) for key, value in new_metrics.items())
            assert all(isinstance(alarm, Alarm) and alarm.step == step and alarm.message for alarm in alarms)

    def test_the_inputs_are_left_as_they_were(self, make_monitor, stream) -> None:
        monitor = make_monitor()
        for step, (metrics, texts) in enumerate(stream):
            before = (dict(metrics), list(texts))
            monitor.observe(step, metrics, texts)
            assert (metrics, texts) == before, "the monitor changed its inputs"

    def test_a_jump_after_a_steady_stretch_alarms(self, make_monitor, stream) -> None:
        monitor = make_monitor()
        alarms = [alarm for step, (metrics, texts) in enumerate(stream) for alarm in monitor.observe(step, metrics, texts)[1]]
        assert alarms, "nothing alarmed on a stream whose every value jumps after a steady stretch"

    def test_nothing_to_watch_is_no_error(self, make_monitor) -> None:
        monitor = make_monitor()
        for step in range(3):
            new_metrics, alarms = monitor.observe(step, {}, [])
            assert alarms == [] and all(math.isfinite(value) for value in new_metrics.values())

    def test_a_monitor_restored_mid_run_observes_exactly_what_an_uninterrupted_one_does(self, make_monitor,
                                                                                       stream) -> None:
        middle = len(stream) * 2 // 3  # past the warm-up, before and across the jump
        uninterrupted = make_monitor()
        expected = self._outputs(uninterrupted, stream)
        first = make_monitor()
        self._outputs(first, stream[:middle])
        state = msgspec.msgpack.decode(msgspec.msgpack.encode(first.state()))  # as a checkpoint stores it
        resumed = make_monitor()
        resumed.restore(state)
        assert self._outputs(resumed, stream, start=middle) == expected[middle:]
