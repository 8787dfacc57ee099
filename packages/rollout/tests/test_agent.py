"""The coding agent loop with a scripted model: parallel tools, malformed calls, compaction, budgets."""

from __future__ import annotations

import asyncio

import pytest

from relayrl.core.wire import TaskSpec
from relayrl.rollout.agent import AgentConfig, CodingAgent, SingleTurn
from relayrl.rollout.chat import parse_tool_calls
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing.scripted import CHAT, TOKENIZER, RecordingTools, ScriptedEngine, call

TASK = TaskSpec(task_id="t1", instruction="Fix the failing test in calc.py.")


def run_agent(replies, config: AgentConfig, tools=None):
    engine = ScriptedEngine(replies, config.compaction_prompt)
    tools = tools or RecordingTools()
    trajectory = asyncio.run(CodingAgent(config).run(
        TASK, proxy=TokenRecordingProxy(engine), tools=tools, chat=CHAT, sampling=SamplingParams(),
        group_id="g", sample_index=0))
    return trajectory, engine, tools


def test_parallel_calls_results_in_order_and_two_compactions():
    config = AgentConfig(context_limit=900, summary_max_tokens=60, max_tokens_per_turn=200,
                         system_prompt="sys", compaction_prompt="Summarise now.")
    replies = [
        "look " + call("echo", text="a") + call("echo", text="b") + call("wait"),
        "more " + call("echo", text="c") + call("echo", text="d"),
        "again " + call("echo", text="e" * 40),
        "then " + call("echo", text="f" * 40),
        "still " + call("echo", text="g" * 40),
        "done: the fix is in calc.py",
    ]
    trajectory, engine, tools = run_agent(replies, config)
    assert trajectory.status == "ok"
    assert [segment.reason for segment in trajectory.segments] == ["start", "compaction", "compaction"]
    assert trajectory.segments[1].summary == "summary 1: tests located, fix pending"
    assert trajectory.segments[2].summary == "summary 2: tests located, fix pending"
    assert engine.summaries == 2 and trajectory.metrics["compactions"] == 2.0
    # A new segment starts from the task and the summary.
    user = trajectory.segments[1].turns[1]
    assert user.role == "user" and "Fix the failing test" in user.text and "summary 1" in user.text
    # Parallel tool calls ran concurrently and came back in call order.
    assert tools.peak == 3
    first_tool_turn = trajectory.segments[0].turns[3]
    assert [result.output for result in first_tool_turn.tool_results] == ["a", "b", ""]
    # Every token the engine produced is in the trajectory, in order, and nothing else was generated.
    spans = trajectory.generated_spans()
    assert [list(span.token_ids()) for span in spans] == engine.emitted
    assert all(set(span.token_versions()) == {7} for span in spans)
    # Each prompt was exactly the segment's tokens so far (context and generated, never
    # re-tokenised) plus the assistant prefix.
    prompts = iter(engine.prompts)
    for segment in trajectory.segments:
        context: list[int] = []
        for turn in segment.turns:
            if turn.role == "assistant":
                assert next(prompts) == context + list(turn.context_token_ids())
            context += list(turn.context_token_ids())
            if turn.generated is not None:
                context += list(turn.generated.token_ids())
    assert trajectory.num_turns == len(engine.emitted)


def test_malformed_unknown_and_excess_calls_get_errors_not_crashes():
    config = AgentConfig(max_tool_calls_per_turn=2, system_prompt="s")
    replies = ["<tool_call>{not json}</tool_call>" + call("rm_rf") + call("echo", text="x"), "ok"]
    trajectory, _, tools = run_agent(replies, config)
    results = trajectory.segments[0].turns[3].tool_results
    assert "not valid JSON" in results[0].error
    assert "unknown tool 'rm_rf'" in results[1].error
    assert "too many tool calls in one turn (limit 2)" in results[2].error
    assert tools.calls == []  # nothing ran
    assert trajectory.status == "ok"


def test_a_tool_call_in_an_environment_without_tools_gets_an_error_not_a_crash():
    # Countdown gives no tools (None): a model that calls one anyway is told so and carries on.
    engine = ScriptedEngine([call("echo", text="x"), "42"], AgentConfig().compaction_prompt)
    trajectory = asyncio.run(CodingAgent(AgentConfig(system_prompt="s")).run(
        TASK, proxy=TokenRecordingProxy(engine), tools=None, chat=CHAT, sampling=SamplingParams(),
        group_id="g", sample_index=0))
    results = trajectory.segments[0].turns[3].tool_results
    assert "unknown tool 'echo' (available: )" in results[0].error
    assert trajectory.status == "ok" and trajectory.segments[0].turns[-1].text == "42"


def test_turn_budget_ends_the_trajectory():
    config = AgentConfig(max_turns=2, system_prompt="s")
    replies = [call("echo", text=str(index)) for index in range(5)]
    trajectory, _, _ = run_agent(replies, config)
    assert trajectory.status == "budget_exhausted" and trajectory.num_turns == 2


def test_context_exhausted_after_max_compactions():
    config = AgentConfig(context_limit=400, summary_max_tokens=40, max_tokens_per_turn=100, max_compactions=1,
                         system_prompt="s", compaction_prompt="Summarise.")
    replies = [call("echo", text="z" * 20) for _ in range(10)]
    trajectory, _, _ = run_agent(replies, config)
    assert trajectory.status == "context_exhausted" and len(trajectory.segments) == 2


def test_single_turn_harness():
    engine = ScriptedEngine(["42"], "unused")
    trajectory = asyncio.run(SingleTurn().run(TASK, proxy=TokenRecordingProxy(engine), tools=None, chat=CHAT,
                                              sampling=SamplingParams(), group_id="g", sample_index=3))
    (turn,) = [turn for turn in trajectory.segments[0].turns if turn.role == "assistant"]
    assert turn.text == "42" and trajectory.sample_index == 3


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', [("bash", {"command": "ls"})]),
    ('a<tool_call>{"name": "x"}</tool_call>b<tool_call>{"name": "y", "arguments": {}}</tool_call>',
     [("x", {}), ("y", {})]),
    ("no calls here", []),
])
def test_parse_tool_calls(text, expected):
    assert [(call.name, call.arguments) for call in parse_tool_calls(text)] == expected


def test_char_tokenizer_round_trip_and_specials():
    ids = TOKENIZER.encode("a<|end|>b")
    assert len(ids) == 3 and ids[1] == TOKENIZER.eos_token_id
    assert TOKENIZER.decode(ids) == "a<|end|>b"


def test_as_context_keeps_the_tokens_and_stops_training_only_the_picked_turns() -> None:
    """A demonstration's mistaken turn becomes context: the segment's tokens are the same, the
    mistake's are no longer trained, every other generated turn still is."""
    from relayrl.core.arrays import pack_u32
    from relayrl.core.wire import GeneratedSpan, Trajectory, TrajectorySegment, Turn
    from relayrl.rollout.agent import iter_segments
    from relayrl.rollout.demonstrations import as_context

    def assistant(prefix: list[int], generated: list[int], text: str) -> Turn:
        return Turn(role="assistant", tokens=pack_u32(prefix), text=text,
                    generated=GeneratedSpan.build(generated, [0.0] * len(generated), 0))

    turns = [Turn(role="user", tokens=pack_u32([1, 2])), assistant([3], [4, 5], "slip"),
             Turn(role="tool", tokens=pack_u32([6])), assistant([3], [7, 8, 9], "fix")]
    trajectory = Trajectory(trajectory_id="t", task_id="k", group_id="g", sample_index=0,
                            segments=[TrajectorySegment(turns=turns)])
    before = list(iter_segments(trajectory))
    after = list(iter_segments(as_context(trajectory, lambda turn: turn.text == "slip")))
    assert [tokens for tokens, _ in after] == [tokens for tokens, _ in before] == [[1, 2, 3, 4, 5, 6, 3, 7, 8, 9]]
    assert before[0][1] == [False, False, False, True, True, False, False, True, True, True]
    assert after[0][1] == [False, False, False, False, False, False, False, True, True, True]
