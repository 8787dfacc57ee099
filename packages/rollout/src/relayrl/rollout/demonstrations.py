"""Demonstrations: scripted players' trajectories through the real harness and the real tools.

A supervised warm-up teaches a fresh model the format of an agent (tool calls, answers, summaries
when asked to compact) before RL teaches it what pays. Its examples must be what a policy would
see: :class:`ScriptedEngine` is an inference engine whose replies a function writes from the
context so far, and :func:`play_scripted` plays it through the run's own harness against an
environment's real sandboxed tools, so every tool result, compaction and token is the real one.
A demonstration may also show a deliberate mistake and its recovery: :func:`as_context` turns the
mistaken turns into context, so the warm-up teaches what follows a mistake, never the mistake.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec

from relayrl.core.arrays import pack_u32
from relayrl.core.wire import TaskSpec, Trajectory, Turn
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, SamplingParams, StreamEvent

__all__ = ["Reply", "ScriptedEngine", "as_context", "asked_to_compact", "play_expert", "play_scripted"]

Reply = Callable[[str, str], str]
"""``reply(key, context)``: the next assistant message, given the current segment's text.
:func:`play_scripted` passes the task id as ``key``; :class:`ScriptedEngine` the group id."""


class ScriptedEngine(InferenceEngine):
    """An inference engine that answers every request with ``reply(group_id, decoded prompt)``.

    The group id is the first component of the request id (the harness's trajectory ids start with
    it). Its logprobs are 0 (it is deterministic); a warm-up trains on its tokens, never on its
    logprobs.
    """

    engine_id = "scripted"

    def __init__(self, tokenizer: Any, reply: Reply, *, version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.version = version

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        text = self.reply(request.request_id.split("/", 1)[0], self.tokenizer.decode(request.prompt))
        tokens = (self.tokenizer.encode(text) + list(request.params.stop_token_ids[:1]))[: request.params.max_tokens]
        for index, token in enumerate(tokens):
            last = index == len(tokens) - 1
            finish = ("stop" if token in request.params.stop_token_ids else "length") if last else None
            yield StreamEvent(tokens=[token], logprobs=[0.0], versions=[self.version], kept=[[token, 0]],
                              engine_id=self.engine_id, finish_reason=finish)


def asked_to_compact(context: str, compaction_prompt: str) -> bool:
    """Whether the harness's last message in ``context`` asks for a summary (never, without a prompt)."""
    return bool(compaction_prompt.strip()) and context.rstrip().endswith(compaction_prompt.strip())


async def play_scripted(tasks: Sequence[TaskSpec], reply: Reply, *,
                        tools: Callable[[TaskSpec], AbstractAsyncContextManager[Any]], harness: Any, chat: Any,
                        tokenizer: Any, concurrency: int = 16) -> list[Trajectory]:
    """One trajectory of ``reply`` per task, through ``harness`` with the environment's ``tools(task)``
    (at most ``concurrency`` of them hold a sandbox at once), in task order."""
    from relayrl.rollout.routing import TokenRecordingProxy

    # Group ids the engine can split off a request id whatever the task ids hold (a "/" would not do).
    task_ids = {f"demo{index}": task.task_id for index, task in enumerate(tasks)}
    proxy = TokenRecordingProxy(ScriptedEngine(tokenizer, lambda group, context: reply(task_ids[group], context)))
    limit = asyncio.Semaphore(concurrency)

    async def one(group_id: str, task: TaskSpec) -> Trajectory:
        async with limit, tools(task) as toolbox:
            return await harness.run(task, proxy=proxy, tools=toolbox, chat=chat, sampling=SamplingParams(),
                                     group_id=group_id, sample_index=0)

    return list(await asyncio.gather(*(one(group_id, task) for group_id, task in zip(task_ids, tasks))))


async def play_expert(tasks: Sequence[TaskSpec], expert: Callable[..., str], *,
                      tools: Callable[[TaskSpec], AbstractAsyncContextManager[Any]], harness: Any, chat: Any,
                      tokenizer: Any, concurrency: int = 16) -> list[Trajectory]:
    """:func:`play_scripted` with an environment's expert ``expert(task, context, *, compaction_prompt,
    summary_header)``, given the harness's compaction markers (an expert must answer a request to
    compact with a summary it can continue from)."""
    by_id = {task.task_id: task for task in tasks}
    compaction_prompt, summary_header = harness.compaction_markers()

    def reply(task_id: str, context: str) -> str:
        return expert(by_id[task_id], context, compaction_prompt=compaction_prompt, summary_header=summary_header)

    return await play_scripted(tasks, reply, tools=tools, harness=harness, chat=chat, tokenizer=tokenizer,
                               concurrency=concurrency)


def as_context(trajectory: Trajectory, mistaken: Callable[[Turn], bool]) -> Trajectory:
    """``trajectory`` with every assistant turn that ``mistaken`` picks turned into context: its
    generated tokens move into the turn's context tokens, which the warm-up conditions on and does
    not train (:func:`relayrl.rollout.agent.iter_segments`). The token sequence is unchanged."""
    def converted(turn: Turn) -> Turn:
        if turn.generated is None or not mistaken(turn):
            return turn
        tokens = [*turn.context_token_ids(), *turn.generated.token_ids()]
        return msgspec.structs.replace(turn, tokens=pack_u32([int(token) for token in tokens]), generated=None)

    segments = [msgspec.structs.replace(segment, turns=[converted(turn) for turn in segment.turns])
                for segment in trajectory.segments]
    return msgspec.structs.replace(trajectory, segments=segments)
