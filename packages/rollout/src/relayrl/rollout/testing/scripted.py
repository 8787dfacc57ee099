"""Test doubles for the code around engines: a scripted engine and recording tools.

:class:`ScriptedEngine` answers with scripted texts in order (and with a summary whenever the agent
asks to compact), recording every token it emits, so a test can check that a trajectory holds
exactly those tokens. :class:`RecordingTools` runs ``echo`` and ``wait`` calls concurrently and
records the peak concurrency. They stand in for a model and a sandbox in tests of the agent loop
and the rollout manager only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from relayrl.core.wire import ToolCall, ToolResult
from relayrl.rollout.chat import CharTokenizer, PlainChatFormat
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, StreamEvent

__all__ = ["CHAT", "TOKENIZER", "RecordingTools", "ScriptedEngine", "call"]

TOKENIZER = CharTokenizer("".join(chr(code) for code in range(32, 127)) + "\n\t")
CHAT = PlainChatFormat(TOKENIZER)


def call(name: str, **arguments) -> str:
    """The text of one tool call in the documented format."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedEngine(InferenceEngine):
    """Answers with scripted texts in order, and with a summary whenever asked to compact.

    A test double for the engine, used to test the agent loop around it. It records every token
    it emits, so the test can check the trajectory holds exactly those tokens.
    """

    engine_id = "scripted"

    def __init__(self, replies: list[str], compaction_prompt: str, *, version: int = 7,
                 per_trajectory: bool = False) -> None:
        self.version = version
        self.replies = list(replies)
        self.compaction_prompt = compaction_prompt
        self.per_trajectory = per_trajectory
        """Give every trajectory its own copy of the script (concurrent agents then do not interleave)."""
        self._scripts: dict[str, list[str]] = {}
        self.summaries = 0
        self.emitted: list[list[int]] = []
        self.prompts: list[list[int]] = []

    def _next_reply(self, request_id: str) -> str:
        if not self.per_trajectory:
            return self.replies.pop(0)
        trajectory = request_id.split("/turn-")[0].split("/summary-")[0]
        return self._scripts.setdefault(trajectory, list(self.replies)).pop(0)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        self.prompts.append(request.prompt)
        prompt_text = TOKENIZER.decode(request.prompt)
        if prompt_text.rstrip().endswith(f"{self.compaction_prompt}<|end|>\n<|assistant|>"):
            self.summaries += 1
            text = f"summary {self.summaries}: tests located, fix pending"
        else:
            text = self._next_reply(request.request_id)
        tokens = (TOKENIZER.encode(text) + CHAT.stop_token_ids())[: request.params.max_tokens]
        self.emitted.append(tokens)
        for index, token in enumerate(tokens):
            last = index == len(tokens) - 1
            finish = ("stop" if token in request.params.stop_token_ids else "length") if last else None
            yield StreamEvent(tokens=[token], logprobs=[-0.25], versions=[self.version], kept=[[token, 0]],
                              engine_id=self.engine_id, finish_reason=finish)


class RecordingTools:
    """Runs `echo` and `wait` calls concurrently and records the peak concurrency."""

    tool_names = ("echo", "wait")

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.calls: list[ToolCall] = []

    async def _one(self, call: ToolCall) -> ToolResult:
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(0.02)
        self.active -= 1
        return ToolResult(call_id=call.id, output=str(call.arguments.get("text", "")), wall_time_s=0.02)

    async def execute(self, calls):
        self.calls += calls
        return list(await asyncio.gather(*(self._one(call) for call in calls)))

    def final_answer(self) -> str:
        return ""  # the answer is the trajectory's text


