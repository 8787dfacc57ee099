"""The code-search environment: generated tasks, sandboxed tools and grading, the expert's demonstrations."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from relayrl.core.config import ConfigError
from relayrl.core.wire import GeneratedSpan, TaskSpec, Trajectory, TrajectorySegment, Turn
from relayrl.environments.code_search import (
    ALPHABET,
    NO_ANSWER,
    SPECIALS,
    CodeSearchConfig,
    CodeSearchEnvironment,
    expert_reply,
    final_answer,
    make_tasks,
    score_answer,
)
from relayrl.rollout.agent import AgentConfig, CodingAgent, iter_segments
from relayrl.rollout.chat import CharTokenizer, RawChatFormat

TOKENIZER = CharTokenizer(ALPHABET, specials=("<pad>", "<bos>", "<|end|>", *SPECIALS))
CHAT = RawChatFormat(TOKENIZER)


def _mentions(task: TaskSpec, identifier: str) -> set[str]:
    return {path for path, text in task.metadata["files"].items() if re.search(rf"\b{identifier}\b", text)}


def test_tasks_are_seeded_distinct_and_answerable_only_with_tools():
    tasks = make_tasks(2000, seed=3)
    assert [task.instruction for task in make_tasks(50, seed=3)] == [task.instruction for task in tasks[:50]]
    repositories = {tuple(sorted(task.metadata["files"].items())) for task in tasks}
    assert len(repositories) == len(tasks)  # thousands of distinct tasks
    held_out = make_tasks(200, seed=3 + 1_000_003, prefix="cs-eval")
    assert not repositories & {tuple(sorted(task.metadata["files"].items())) for task in held_out}
    for task in tasks[:300]:
        asked = task.metadata["identifiers"]
        assert task.instruction == f"find: {' '.join(asked)}"
        assert set(task.answer) == set().union(*(_mentions(task, name) for name in asked))
        assert not any(part in task.instruction for path in task.metadata["files"] for part in re.split(r"[/.]", path)
                       if len(part) > 3)  # no file or directory name is in the prompt
        assert all(char in ALPHABET for text in task.metadata["files"].values() for char in text)


@pytest.mark.parametrize(("answer", "expected"), [
    ("src/a.py lib/b.py", 1.0), ("./src/a.py, lib/b.py.", 1.0), ("src/a.py", 2 / 3),
    ("src/a.py lib/b.py app/c.py", 0.8), ("", 0.0), ("a.py b.py", 0.0), ("app/c.py", 0.0),
    ("src/a.py src/a.py lib/b.py", 1.0),
])
def test_score_is_f1_of_the_named_files(answer, expected):
    assert score_answer(answer, ["src/a.py", "lib/b.py"]) == pytest.approx(expected)


def test_flat_repositories_name_files_by_their_word_alone():
    tasks = make_tasks(50, seed=1, directories=0)
    assert all("/" not in path for task in tasks for path in task.metadata["files"])
    assert len({path for task in tasks for path in task.metadata["files"]}) > 20
    truth = tasks[0].answer
    assert score_answer(" ".join(f"./{path}" for path in truth), truth) == 1.0
    assert score_answer("none", truth) == 0.0


def test_final_answer_is_the_last_message_without_tool_calls():
    span = GeneratedSpan.build([5], [-0.1], [1])
    answered = Trajectory(trajectory_id="t", task_id="x", group_id="g", sample_index=0, segments=[TrajectorySegment(
        turns=[Turn(role="assistant", generated=span, text="src/a.py")])])
    calling = Trajectory(trajectory_id="t", task_id="x", group_id="g", sample_index=0, segments=[TrajectorySegment(
        turns=[Turn(role="assistant", generated=span, text='<tool_call>{"name": "list"}</tool_call> src/a.py')])])
    assert final_answer(answered) == "src/a.py" and final_answer(calling) == ""


def test_the_sandboxed_grader_agrees_with_the_reference_and_pays_no_cheat():
    environment = CodeSearchEnvironment(CodeSearchConfig())
    rng = random.Random(0)
    truth = ["src/kobe.py", "lib/tamu.py"]
    answers = ["src/kobe.py lib/tamu.py", "lib/tamu.py", "", "src/kobe.py lib/tamu.py app/x.py", "*.py",
               "print(1)", "__import__('os').system('true') src/kobe.py", "\x00" * 10,
               " ".join(rng.choice(["src/kobe.py", "lib/tamu.py", "web/a.py", "x"]) for _ in range(6))]
    items = [{"answer": answer, "truth": truth} for answer in answers]
    assert environment.grader.grade_sync(items) == pytest.approx([score_answer(a, truth) for a in answers])
    assert environment.grader.sandbox_calls == 1


def _harness(context_limit: int = 400) -> CodingAgent:
    return CodingAgent(AgentConfig(system_prompt="", max_turns=6, max_tokens_per_turn=128, max_total_tokens=512,
                                   context_limit=context_limit, summary_max_tokens=80, compaction_prompt="compact:",
                                   summary_header="summary:", show_tool_time=False))


@pytest.mark.parametrize("context_limit", [1000, 330])
def test_the_expert_solves_every_task_through_real_sandboxes(context_limit):
    """Demonstrations run the real harness and tools: every one is graded 1, and under a tight
    context limit some compact and still answer from their summary."""
    environment = CodeSearchEnvironment(CodeSearchConfig(demonstrations=24))
    trajectories = asyncio.run(environment.demonstrate(harness=_harness(context_limit), chat=CHAT, tokenizer=TOKENIZER))
    tasks = environment.demonstration_tasks()

    async def grade():
        return [(await environment.grade(task, [trajectory], [""]))[0] for task, trajectory in zip(tasks, trajectories)]

    graded = asyncio.run(grade())
    failed = [(task.task_id, trajectory.reward, final_answer(trajectory), trajectory.metrics)
              for task, trajectory in zip(tasks, graded) if trajectory.reward != 1.0]
    assert not failed, failed
    calls = [len(turn.tool_calls) for trajectory in trajectories for segment in trajectory.segments
             for turn in segment.turns if turn.role == "assistant"]
    assert sum(calls) >= 2 * len(tasks) and max(calls) >= 2  # every identifier searched; some turns in parallel
    results = [result for trajectory in trajectories for segment in trajectory.segments for turn in segment.turns
               for result in turn.tool_results]
    assert results and all(result.exit_status == 0 and result.wall_time_s > 0 for result in results), results
    compacted = [trajectory for trajectory in trajectories if trajectory.metrics["compactions"] > 0]
    if context_limit < 400:
        assert compacted and all(len(trajectory.segments) >= 2 for trajectory in compacted)
        assert any("summary:" in TOKENIZER.decode(tokens) for trajectory in compacted
                   for tokens, _ in iter_segments(trajectory))
    else:
        assert not compacted, [trajectory.metrics for trajectory in compacted]
    for trajectory in trajectories:  # trained tokens are exactly the generated ones
        for tokens, trained in iter_segments(trajectory):
            assert len(tokens) == len(trained) and any(trained) and not all(trained)


def test_careless_players_stop_early_or_answer_without_searching_and_wasteful_ones_list_first():
    """A mixture with careless styles: early-stop searches once and answers what it saw, no-search
    answers at once and names no file; list-first lists the repository, then solves the task like
    the parallel expert (one turn and one call more); verbose names every file twice (the same
    reward); the experts' share still solves every task."""
    styles = {"parallel": 1.0, "list-first": 1.0, "verbose": 1.0, "early-stop": 1.0, "no-search": 1.0}
    environment = CodeSearchEnvironment(CodeSearchConfig(demonstrations=30, demonstration_styles=styles))
    tasks = environment.demonstration_tasks()
    assert {task.metadata["style"] for task in tasks} == set(styles)
    trajectories = asyncio.run(environment.demonstrate(harness=_harness(), chat=CHAT, tokenizer=TOKENIZER))

    async def grade():
        return [(await environment.grade(task, [trajectory], [""]))[0] for task, trajectory in zip(tasks, trajectories)]

    listed = 0
    for task, trajectory in zip(tasks, asyncio.run(grade())):
        calls = sum(len(turn.tool_calls) for segment in trajectory.segments for turn in segment.turns)
        style = task.metadata["style"]
        answer = final_answer(trajectory)
        if style == "no-search":
            assert calls == 0 and answer == NO_ANSWER and trajectory.reward == 0.0
        elif style == "early-stop":
            first = task.metadata["identifiers"][0]
            assert calls == 1 and set(answer.split()) == _mentions(task, first)
            assert trajectory.reward == pytest.approx(score_answer(answer, list(task.answer)))
        else:
            assert trajectory.reward == 1.0
            named = answer.split()
            assert len(named) == len(set(named)) * (2 if style == "verbose" else 1), (style, answer)
            names = [[call.name for call in turn.tool_calls] for segment in trajectory.segments
                     for turn in segment.turns if turn.role == "assistant"]
            searches = [["grep"] * len(task.metadata["identifiers"])]
            if not any(segment.reason == "compaction" for segment in trajectory.segments):
                assert names == ([["list"]] if style == "list-first" else []) + searches + [[]], names
                listed += style == "list-first"
    assert listed  # some list-first demonstrations ran without compacting, and were checked call by call


def test_demonstrations_without_tool_times_are_the_same_tokens_every_time():
    """With show_tool_time off (and grep's files in path order), a demonstration depends on the task
    alone: two plays give the same tokens, so the warm-up is the same from run to run."""
    environment = CodeSearchEnvironment(CodeSearchConfig(demonstrations=12, files=[6, 7]))
    harness = CodingAgent(AgentConfig(system_prompt="", max_turns=6, max_tokens_per_turn=128, max_total_tokens=512,
                                      context_limit=400, summary_max_tokens=80, compaction_prompt="compact:",
                                      summary_header="summary:", show_tool_time=False))

    def play():
        trajectories = asyncio.run(environment.demonstrate(harness=harness, chat=CHAT, tokenizer=TOKENIZER))
        return [tokens for trajectory in trajectories for tokens, _ in iter_segments(trajectory)]

    first = play()
    assert first == play()
    assert not any("time=" in TOKENIZER.decode(tokens) for tokens in first)
    assert sum(TOKENIZER.decode(tokens).count(".py:") >= 2 for tokens in first) > 0  # results with several files


def test_expert_summary_keeps_what_is_found_and_what_is_left():
    task = make_tasks(1, seed=0)[0]
    first, second = task.metadata["identifiers"]
    context = (f"{task.instruction}<tool_call>{{\"name\": \"grep\", \"arguments\": {{\"pattern\": \"{first}\"}}}}"
               f"</tool_call>[t1-0] exit=0 time=0.01s\n./src/kobe.py:1:x = {first}\ncompact:")
    summary = expert_reply(task, context, compaction_prompt="compact:", summary_header="summary:")
    assert summary == f"seen src/kobe.py todo {second}"
    resumed = f"{task.instruction}\n\nsummary:\n{summary}"
    assert f'"pattern": "{second}"' in expert_reply(task, resumed, compaction_prompt="compact:",
                                                    summary_header="summary:")


@pytest.mark.parametrize(("options", "key"), [
    ({"files": [3]}, "files"), ({"identifiers": [3, 2]}, "identifiers"), ({"files": [1, 1]}, "files"),
    ({"tools": ["rm"]}, "tools"), ({"tools": []}, "tools"), ({"demonstration_styles": {"lazy": 1.0}}, "demonstration_styles"),
    ({"demonstration_styles": {"parallel": 0.0}}, "demonstration_styles"), ({"directories": 11}, "directories"),
    ({"directories": 0, "files": [4, 40]}, "files"),
    ({"demonstration_styles": {"parallel": -1.0, "sequential": 2.0}}, "demonstration_styles"),
    ({"tool_latency_s": [0.5]}, "tool_latency_s"), ({"tool_latency_s": [0.0, 1.0]}, "tool_latency_s"),
    ({"tool_latency_s": [2.0, 1.0]}, "tool_latency_s"),
])
def test_bad_options_name_their_key(options, key):
    with pytest.raises(ConfigError, match=rf"env\.{key}"):
        CodeSearchConfig(**options).check(None, "env")


def test_simulated_tool_latency_delays_each_turn_by_its_slowest_call_and_is_reported():
    """tool_latency_s (for benchmarks of asynchrony): real sandboxed results, each call's wall time
    raised by its draw, and a turn of parallel calls waiting only for its slowest draw."""
    from relayrl.core.wire import ToolCall

    environment = CodeSearchEnvironment(CodeSearchConfig(tool_latency_s=[0.2, 0.4]))
    task = environment.tasks()[0]
    identifier = task.metadata["identifiers"][0]
    calls = [ToolCall(id=f"c{index}", name="grep", arguments={"pattern": identifier}) for index in range(4)]

    async def one_turn():
        async with environment.tools(task) as tools:
            started = asyncio.get_running_loop().time()
            results = await tools.execute(calls)
            return results, asyncio.get_running_loop().time() - started

    try:
        results, elapsed = asyncio.run(one_turn())
    finally:
        environment.close()
    assert [result.call_id for result in results] == ["c0", "c1", "c2", "c3"]
    assert all(result.exit_status == 0 and result.wall_time_s >= 0.2 for result in results), results
    assert max(result.wall_time_s for result in results) <= elapsed  # waited for the slowest draw, once
    assert elapsed < sum(result.wall_time_s for result in results)
