"""An agent harness: the model thinks in one turn, is asked for its final answer, and answers.

A harness turns one task into one trajectory. Everything the policy sees is tokens: rendered
messages (``chat.render``) and the tokens it generated, appended in order, never re-tokenised
text; every generation goes through ``proxy`` (the token-recording proxy, which resumes it on
another engine if one dies). The trainer then trains on exactly those tokens.
"""

from __future__ import annotations

import time
import uuid

import msgspec

from relayrl.core.arrays import pack_u32
from relayrl.core.config import Section
from relayrl.core.wire import TaskSpec, Timings, Trajectory, TrajectorySegment, Turn
from relayrl.rollout.protocol import GenerateRequest, SamplingParams


class ThinkThenAnswer:
    """Two assistant turns: free thinking, then the answer after ``answer_prompt``. No tools."""

    class Config(Section, kw_only=True):
        think_tokens: int = 128
        answer_tokens: int = 64
        answer_prompt: str = "Now give only your final answer."

    def __init__(self, config: ThinkThenAnswer.Config | None = None) -> None:
        self.config = config or self.Config()

    def compaction_markers(self) -> tuple[str, str]:
        return "", ""  # it never compacts

    async def run(self, task: TaskSpec, *, proxy, tools, chat, sampling: SamplingParams, group_id: str,
                  sample_index: int) -> Trajectory:
        trajectory_id = f"{group_id}/{sample_index}-{uuid.uuid4().hex[:8]}"
        started = time.time()
        turns = [Turn(role="user", tokens=pack_u32(chat.render("user", task.instruction)), text=task.instruction)]
        stops = sorted({*sampling.stop_token_ids, *chat.stop_token_ids()})
        for step, max_tokens in (("think", self.config.think_tokens), ("answer", self.config.answer_tokens)):
            if step == "answer":
                turns.append(Turn(role="user", tokens=pack_u32(chat.render("user", self.config.answer_prompt)),
                                  text=self.config.answer_prompt))
            context = [token for turn in turns for token in _tokens(turn)]
            prefix = chat.assistant_prefix()
            params = msgspec.structs.replace(sampling, max_tokens=max_tokens, stop_token_ids=stops)
            result = await proxy.generate(GenerateRequest(request_id=f"{trajectory_id}/{step}",
                                                          prompt=context + prefix, params=params))
            tokens = [token for token in result.span.token_ids() if token not in stops]
            turns.append(Turn(role="assistant", tokens=pack_u32(prefix), generated=result.span, text=chat.decode(tokens)))
        return Trajectory(trajectory_id=trajectory_id, task_id=task.task_id, group_id=group_id,
                          sample_index=sample_index, segments=[TrajectorySegment(turns=turns)],
                          timings=Timings(started_at=started, finished_at=time.time()))


def _tokens(turn: Turn) -> list[int]:
    """A turn as the next prompt holds it: its rendered tokens, then what it generated."""
    tokens = list(turn.context_token_ids())
    if turn.generated is not None:
        tokens += list(turn.generated.token_ids())
    return tokens
