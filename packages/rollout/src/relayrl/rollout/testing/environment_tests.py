"""``EnvironmentTests`` and ``HarnessTests``: the conformance suites of environments and agent
harnesses, built in or plugin.

Subclass one and override its fixtures::

    from relayrl.rollout.testing import EnvironmentTests, HarnessTests

    class TestMyEnvironment(EnvironmentTests):
        @pytest.fixture
        def environment(self):
            return MyEnvironment(MyEnvironment.Config(tasks=20))

        def reference_answer(self, environment, task):   # optional: what a correct episode ends with
            return ("the answer text", "")                # (final assistant text, tools' final_answer())

    class TestMyHarness(HarnessTests):
        @pytest.fixture
        def harness(self):
            return MyHarness(MyHarness.Config())

An environment must: give distinct training tasks and keep held-out tasks out of training; open and
close its tools for any task (the executor names its tools and gives a final answer); grade a group
in its order with finite rewards, paying a correct answer more than garbage (graded where the answer
cannot forge its reward: the built-ins grade in a sandbox); and report float metrics. A harness must
turn a task into a trajectory whose every prompt is exactly the trajectory's tokens so far (the
trainer trains on what the policy saw), through the token-recording proxy, with and without tools.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from relayrl.core.wire import GeneratedSpan, TaskSpec, Trajectory, TrajectorySegment, Turn
from relayrl.rollout.evaluation import split_tasks
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing.scripted import CHAT, RecordingTools, ScriptedEngine, call

GARBAGE = "I could not do it. ]]}} rm -rf / ; exit 0"


def answered(task: TaskSpec, text: str, index: int = 0) -> Trajectory:
    """A one-turn trajectory whose assistant message is ``text`` (what graders that read the text see)."""
    span = GeneratedSpan.build(tokens=[1], logprobs=[0.0], versions=[0])
    return Trajectory(trajectory_id=f"{task.task_id}/{index}", task_id=task.task_id, group_id=task.task_id,
                      sample_index=index, segments=[TrajectorySegment(turns=[
                          Turn(role="user", text=task.instruction), Turn(role="assistant", generated=span, text=text)])])


class EnvironmentTests:
    """Conformance suite for environments (``relayrl_rollout_environments``)."""

    @pytest.fixture
    def environment(self) -> Any:
        raise NotImplementedError("override the `environment` fixture to return the environment under test")

    def reference_answer(self, environment: Any, task: TaskSpec) -> tuple[str, str] | None:
        """A correct episode's ``(final assistant text, tools' final_answer())`` for ``task``; None: the
        suite skips the reward check. Default: the environment's own single-answer demonstration."""
        text = environment.demonstration(task)
        return None if text is None else (text, "")

    def test_training_tasks_are_distinct_and_held_out_ones_never_trained_on(self, environment) -> None:
        tasks = environment.tasks()
        assert tasks and all(isinstance(task, TaskSpec) for task in tasks)
        assert len({task.task_id for task in tasks}) == len(tasks)
        training, held_out = split_tasks(environment)
        assert training
        held_ids, held_prompts = {task.task_id for task in held_out}, {task.instruction for task in held_out}
        assert not any(task.task_id in held_ids or task.instruction in held_prompts for task in training)

    def test_tools_open_and_close_for_a_task(self, environment) -> None:
        task = environment.tasks()[0]

        async def open_tools() -> None:
            async with environment.tools(task) as tools:
                if tools is not None:  # an environment without tools yields None
                    assert list(tools.tool_names) and all(isinstance(name, str) for name in tools.tool_names)
                    assert isinstance(await asyncio.to_thread(tools.final_answer), str)

        asyncio.run(open_tools())

    def test_a_group_is_graded_in_order_with_finite_rewards(self, environment) -> None:
        task = environment.tasks()[0]
        group = [answered(task, GARBAGE, index) for index in range(3)]
        graded = asyncio.run(environment.grade(task, group, ["", "", ""]))
        assert [trajectory.trajectory_id for trajectory in graded] == [trajectory.trajectory_id for trajectory in group]
        assert all(math.isfinite(trajectory.reward) for trajectory in graded)

    def test_a_correct_answer_earns_more_than_garbage(self, environment) -> None:
        for task in environment.tasks()[:3]:
            reference = self.reference_answer(environment, task)
            if reference is None:
                pytest.skip(f"{type(environment).__name__}: no reference answer (override reference_answer)")
            text, answer = reference
            graded = asyncio.run(environment.grade(task, [answered(task, text, 0), answered(task, GARBAGE, 1)],
                                                   [answer, GARBAGE if answer else ""]))
            assert graded[0].reward > graded[1].reward, task.task_id

    def test_metrics_are_floats(self, environment) -> None:
        metrics = environment.metrics()
        assert isinstance(metrics, dict) and all(isinstance(value, float) for value in metrics.values())


class HarnessTests:
    """Conformance suite for agent harnesses (``relayrl_rollout_harnesses``), driven by a scripted model."""

    @pytest.fixture
    def harness(self) -> Any:
        raise NotImplementedError("override the `harness` fixture to return the harness under test")

    TASK = TaskSpec(task_id="t1", instruction="Say hello, using a tool if you have one.")

    def _run(self, harness: Any, replies: list[str], tools: Any) -> tuple[Trajectory, ScriptedEngine]:
        compaction_prompt, _ = harness.compaction_markers()
        # Padded: a harness may generate more than once (think, then answer); extra replies are unused.
        engine = ScriptedEngine([*replies, *["hello"] * 8], compaction_prompt or "unused")
        trajectory = asyncio.run(harness.run(self.TASK, proxy=TokenRecordingProxy(engine), tools=tools, chat=CHAT,
                                             sampling=SamplingParams(), group_id="g", sample_index=0))
        return trajectory, engine

    def _prompts_are_the_trajectory_so_far(self, trajectory: Trajectory, engine: ScriptedEngine) -> None:
        # Each request's prompt is the segment's tokens before that generation (plus the assistant
        # prefix): the trainer replays exactly what the policy saw.
        generations = [(segment, index) for segment in trajectory.segments
                       for index, turn in enumerate(segment.turns) if turn.generated is not None]
        assert len(engine.prompts) == len(generations) > 0
        for prompt, (segment, index) in zip(engine.prompts, generations):
            before = [token for turn in segment.turns[:index] for token in turn_tokens(turn)]
            context = list(segment.turns[index].context_token_ids())  # the assistant prefix
            assert prompt == before + context

    def test_without_tools_it_answers_through_the_proxy(self, harness) -> None:
        trajectory, engine = self._run(harness, ["hello"], tools=None)
        assert trajectory.task_id == "t1" and trajectory.group_id == "g" and trajectory.num_generated_tokens > 0
        self._prompts_are_the_trajectory_so_far(trajectory, engine)

    def test_with_tools_every_prompt_is_the_trajectory_so_far(self, harness) -> None:
        tools = RecordingTools()
        trajectory, engine = self._run(harness, [call("echo", text="hi") + call("echo", text="there"), "hello"],
                                       tools=tools)
        self._prompts_are_the_trajectory_so_far(trajectory, engine)

    def test_compaction_markers_are_strings(self, harness) -> None:
        prompt, header = harness.compaction_markers()
        assert isinstance(prompt, str) and isinstance(header, str)


def turn_tokens(turn: Turn) -> list[int]:
    """A turn's tokens as the next prompt holds them: its context tokens, then what it generated."""
    tokens = list(turn.context_token_ids())
    if turn.generated is not None:
        tokens += list(turn.generated.token_ids())
    return tokens
