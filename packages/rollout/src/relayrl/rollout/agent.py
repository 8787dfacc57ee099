"""Agent harnesses: the multi-turn tool-using coding agent with self-compaction, and a single-turn one.

A harness turns one task into one :class:`relayrl.core.wire.Trajectory`. The coding agent loop:

1. Context = rendered system and user messages (the task's instruction).
2. Generate an assistant turn through the token-recording proxy (stop at the end-of-turn token).
3. Parse its tool calls (``<tool_call>{json}</tool_call>``, see :mod:`relayrl.rollout.chat`); none
   means the agent is done. Malformed calls, unknown tools and calls beyond
   ``max_tool_calls_per_turn`` get an error result; the others run concurrently in the sandbox.
4. Append one rendered ``tool`` message per call, in call order; go to 2.

**Self-compaction.** Before a turn, if the context could not hold the turn plus a summary, the
agent is asked (a ``user`` message, ``compaction_prompt``) to summarise its working state; the
summary is an assistant turn like any other, trained with the trajectory's reward. A new
segment then starts from the system message and the task with the summary appended, and the loop
continues. The trajectory keeps every segment. ``max_compactions`` bounds it; past it the
trajectory ends with status ``context_exhausted``.

**Budgets.** Turns, generated tokens and wall time; when one runs out the trajectory ends with
status ``budget_exhausted`` (it is still graded). The costs the length penalty uses (tokens, turns,
tool seconds) are all recorded on the trajectory.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Protocol

import msgspec

from relayrl.core.arrays import pack_u32
from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec, Timings, ToolCall, ToolResult, Trajectory, TrajectorySegment, Turn
from relayrl.rollout.chat import ChatFormat, MalformedCall, format_tool_result, parse_tool_calls
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

__all__ = ["AgentConfig", "CodingAgent", "SingleTurn", "ToolExecutor", "iter_segments"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. Call tools with "
    '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>; several calls in one message run in '
    "parallel. When you are done, answer without tool calls."
)
DEFAULT_COMPACTION_PROMPT = (
    "Your context window is nearly full. Summarise your working state: what the task is, what you "
    "have found, what you changed, and what remains to do. Be concise; you will continue from this summary."
)


class ToolExecutor(Protocol):
    """Runs tool calls (in a sandbox); returns one result per call, in call order.

    relayrl-sandbox's :class:`~relayrl.sandbox.ToolBox` is one.
    """

    @property
    def tool_names(self) -> Sequence[str]: ...

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]: ...

    def final_answer(self) -> str:
        """The episode's answer as the grader receives it, taken before the tools are closed (e.g. the
        diff of the sandbox's workspace); "" when the answer is the trajectory's own text."""


class AgentConfig(Section, kw_only=True):
    """``[rollout.harness_options]`` of ``harness = "coding-agent"``: budgets, context and compaction."""

    max_turns: int = 32
    max_total_tokens: int = 32768
    """Generated tokens over the whole trajectory, all segments."""
    max_tokens_per_turn: int = 1024
    max_wall_time_s: float = 3600.0
    context_limit: int = 8192
    """Tokens one segment's context may hold, generation included."""
    max_compactions: int = 8
    summary_max_tokens: int = 512
    max_tool_calls_per_turn: int = 8
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    compaction_prompt: str = DEFAULT_COMPACTION_PROMPT
    summary_header: str = "Summary of your work so far:"
    show_tool_time: bool = True
    """Whether a tool result shows the model its wall time (``time=0.05s``); the time is recorded
    either way. Off, a trajectory's tokens depend on the tools' outputs alone, so demonstrations and
    their warm-up are the same from run to run."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        # A zero budget would leave every trajectory waiting on an engine that may generate nothing.
        _at_least_one(self, ("max_turns", "max_total_tokens", "max_tokens_per_turn", "context_limit",
                             "summary_max_tokens", "max_tool_calls_per_turn"), path)
        if not self.max_wall_time_s > 0:
            raise ConfigError(f"{path}.max_wall_time_s: must be > 0, got {self.max_wall_time_s}")
        if self.max_compactions < 0:
            raise ConfigError(f"{path}.max_compactions: must be >= 0, got {self.max_compactions}")


def _at_least_one(section: Section, keys: Sequence[str], path: str) -> None:
    for key in keys:
        if getattr(section, key) < 1:
            raise ConfigError(f"{path}.{key}: must be at least 1, got {getattr(section, key)}")


@dataclasses.dataclass
class _State:
    segments: list[TrajectorySegment]
    turns: list[Turn]
    context: list[int]
    generated_tokens: int = 0
    assistant_turns: int = 0
    generation_s: float = 0.0
    tool_s: float = 0.0
    engine_ids: list[str] = dataclasses.field(default_factory=list)
    routed: int = 0
    """Positions of the current segment whose expert routing an earlier turn's span recorded."""

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)
        self.context += list(turn.context_token_ids())
        if turn.generated is not None:
            self.context += list(turn.generated.token_ids())


async def generate_turn(state: _State, proxy: TokenRecordingProxy, chat: ChatFormat, sampling: SamplingParams,
                        max_tokens: int, request_id: str) -> Turn:
    """One assistant turn after ``state.context``, generated through the proxy; ``state`` counts it."""
    prefix = chat.assistant_prefix()
    params = msgspec.structs.replace(sampling, max_tokens=max_tokens,
                                     stop_token_ids=sorted({*sampling.stop_token_ids, *chat.stop_token_ids()}))
    if sampling.routing_from is not None:  # an MoE policy: routing of the positions not recorded yet
        params = msgspec.structs.replace(params, routing_from=state.routed)
    started = time.monotonic()
    result = await proxy.generate(GenerateRequest(request_id=request_id, prompt=state.context + prefix,
                                                  params=params))
    state.generation_s += time.monotonic() - started
    state.generated_tokens += len(result.span)
    state.assistant_turns += 1
    state.engine_ids += [engine for engine in result.engine_ids if engine not in state.engine_ids]
    if result.span.routing is not None:
        state.routed = result.span.routing.end
    tokens = list(result.span.token_ids())
    if tokens and tokens[-1] in params.stop_token_ids:
        tokens = tokens[:-1]  # the end-of-turn token is part of the span, not of the text
    return Turn(role="assistant", tokens=_pack(prefix), generated=result.span, text=chat.decode(tokens))


class CodingAgent:
    """The tool-using coding agent (harness ``coding-agent``); see the module docstring."""

    Config = AgentConfig

    def __init__(self, config: AgentConfig | None = None) -> None:
        self.config = config or AgentConfig()

    def compaction_markers(self) -> tuple[str, str]:
        """``(compaction_prompt, summary_header)``: how a scripted expert sees it is asked to compact,
        and where a new segment's summary starts."""
        return self.config.compaction_prompt, self.config.summary_header

    def _start_segment(self, chat: ChatFormat, task: TaskSpec, summary: str = "") -> tuple[list[Turn], list[int]]:
        instruction = task.instruction if not summary else f"{task.instruction}\n\n{self.config.summary_header}\n{summary}"
        turns = [Turn(role="system", tokens=_pack(chat.render("system", self.config.system_prompt)),
                      text=self.config.system_prompt),
                 Turn(role="user", tokens=_pack(chat.render("user", instruction)), text=instruction)]
        context = [token for turn in turns for token in turn.context_token_ids()]
        return turns, context

    def _fits(self, state: _State, chat: ChatFormat, max_tokens: int) -> bool:
        compaction_cost = (len(chat.render("user", self.config.compaction_prompt)) + len(chat.assistant_prefix())
                           + self.config.summary_max_tokens)
        return len(state.context) + len(chat.assistant_prefix()) + max_tokens + compaction_cost <= self.config.context_limit

    async def run(self, task: TaskSpec, *, proxy: TokenRecordingProxy, tools: ToolExecutor | None, chat: ChatFormat,
                  sampling: SamplingParams, group_id: str, sample_index: int) -> Trajectory:
        config = self.config
        trajectory_id = f"{group_id}/{sample_index}-{uuid.uuid4().hex[:8]}"
        started_at, started = time.time(), time.monotonic()
        turns, context = self._start_segment(chat, task)
        state = _State(segments=[], turns=turns, context=context)
        status, compactions, reason, summary = "ok", 0, "start", ""
        while True:
            remaining = config.max_total_tokens - state.generated_tokens
            if state.assistant_turns >= config.max_turns or remaining <= 0 or \
                    time.monotonic() - started > config.max_wall_time_s:
                status = "budget_exhausted"
                break
            max_tokens = min(config.max_tokens_per_turn, remaining)
            if not self._fits(state, chat, max_tokens):
                if compactions >= config.max_compactions:
                    status = "context_exhausted"
                    break
                # Ask for a summary in this segment, then continue in a new one from it.
                prompt = Turn(role="user", tokens=_pack(chat.render("user", config.compaction_prompt)),
                              text=config.compaction_prompt)
                state.add(prompt)
                summary_turn = await generate_turn(state, proxy, chat, sampling,
                                                    min(config.summary_max_tokens, remaining),
                                                    f"{trajectory_id}/summary-{compactions}")
                state.add(summary_turn)
                state.segments.append(TrajectorySegment(turns=state.turns, reason=reason, summary=summary))
                summary, reason = summary_turn.text.strip(), "compaction"
                compactions += 1
                state.turns, state.context = self._start_segment(chat, task, summary)
                state.routed = 0
                continue
            turn = await generate_turn(state, proxy, chat, sampling, max_tokens,
                                        f"{trajectory_id}/turn-{state.assistant_turns}")
            parsed = parse_tool_calls(turn.text, id_prefix=f"t{state.assistant_turns}")
            calls = [call for call in parsed if isinstance(call, ToolCall)]
            turn = msgspec.structs.replace(turn, tool_calls=calls)
            state.add(turn)
            if not parsed:
                break
            results = await self._run_tools(parsed, tools, state)
            texts = [format_tool_result(result, show_time=self.config.show_tool_time) for result in results]
            rendered = [token for text in texts for token in chat.render("tool", text)]
            state.add(Turn(role="tool", tokens=_pack(rendered), tool_results=results, text="\n".join(texts)))
        state.segments.append(TrajectorySegment(turns=state.turns, reason=reason, summary=summary))
        timings = Timings(started_at=started_at, finished_at=time.time(), generation_s=state.generation_s,
                          tool_s=state.tool_s)
        return Trajectory(trajectory_id=trajectory_id, task_id=task.task_id, group_id=group_id,
                          sample_index=sample_index, segments=state.segments, timings=timings,
                          engine_ids=state.engine_ids, status=status,
                          metrics={"compactions": float(compactions)})

    async def _run_tools(self, parsed: list[ToolCall | MalformedCall], tools: ToolExecutor | None, state: _State
                         ) -> list[ToolResult]:
        limit = self.config.max_tool_calls_per_turn
        known = set(tools.tool_names) if tools is not None else set()  # an environment without tools
        results: dict[int, ToolResult] = {}
        runnable: list[tuple[int, ToolCall]] = []
        for index, call in enumerate(parsed):
            if isinstance(call, MalformedCall):
                results[index] = ToolResult(call_id=call.call_id, exit_status=-1, error=call.error)
            elif index >= limit:
                results[index] = ToolResult(call_id=call.id, exit_status=-1,
                                            error=f"too many tool calls in one turn (limit {limit}); not run")
            elif call.name not in known:
                results[index] = ToolResult(call_id=call.id, exit_status=-1,
                                            error=f"unknown tool {call.name!r} (available: {', '.join(sorted(known))})")
            else:
                runnable.append((index, call))
        if runnable and tools is not None:
            started = time.monotonic()
            outputs = await tools.execute([call for _, call in runnable])
            state.tool_s += time.monotonic() - started
            for (index, _), result in zip(runnable, outputs):
                results[index] = result
        return [results[index] for index in range(len(parsed))]


class SingleTurn:
    """One generation from the system message and the task; no tools (harness ``single-turn``)."""

    class Config(Section, kw_only=True):
        max_tokens: int = 256
        system_prompt: str = ""

        def check(self, pm: PluginManager | None, path: str) -> None:
            _at_least_one(self, ("max_tokens",), path)

    def __init__(self, config: SingleTurn.Config | None = None) -> None:
        self.config = config or self.Config()

    def compaction_markers(self) -> tuple[str, str]:
        return "", ""  # it never compacts

    async def run(self, task: TaskSpec, *, proxy: TokenRecordingProxy, tools: ToolExecutor | None, chat: ChatFormat,
                  sampling: SamplingParams, group_id: str, sample_index: int) -> Trajectory:
        turns: list[Turn] = []
        if self.config.system_prompt:
            turns.append(Turn(role="system", tokens=_pack(chat.render("system", self.config.system_prompt)),
                              text=self.config.system_prompt))
        turns.append(Turn(role="user", tokens=_pack(chat.render("user", task.instruction)), text=task.instruction))
        state = _State(segments=[], turns=turns, context=[t for turn in turns for t in turn.context_token_ids()])
        started_at = time.time()
        trajectory_id = f"{group_id}/{sample_index}-{uuid.uuid4().hex[:8]}"
        turn = await generate_turn(state, proxy, chat, sampling, self.config.max_tokens, trajectory_id)
        state.add(turn)
        return Trajectory(trajectory_id=trajectory_id, task_id=task.task_id, group_id=group_id,
                          sample_index=sample_index, segments=[TrajectorySegment(turns=state.turns)],
                          timings=Timings(started_at=started_at, finished_at=time.time(),
                                          generation_s=state.generation_s),
                          engine_ids=state.engine_ids)


def iter_segments(trajectory: Trajectory) -> Iterator[tuple[list[int], list[bool]]]:
    """Each segment of ``trajectory`` as ``(tokens, trained)``: generated tokens are the trained ones."""
    for segment in trajectory.segments:
        tokens: list[int] = []
        trained: list[bool] = []
        for turn in segment.turns:
            context = list(turn.context_token_ids())
            tokens += context
            trained += [False] * len(context)
            if turn.generated is not None:
                generated = list(turn.generated.token_ids())
                tokens += generated
                trained += [True] * len(generated)
        yield tokens, trained


def _pack(tokens: Sequence[int]) -> bytes:
    return pack_u32(tokens)
