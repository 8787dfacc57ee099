"""Realistic scored groups for tests and benchmarks, built with ``GeneratedSpan.build``.

Each trajectory has a system prompt, then ``turns`` assistant turns with generated spans
(token ids, logprobs, policy versions, top-p kept-sets) and tool results in between, like an agent
rollout; the reward, the policy versions and the duration are chosen by the caller.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from relayrl.core import wire
from relayrl.core.arrays import pack_u32

VOCAB = 151_936


def make_trajectory(*, task_id: str, group_id: str, sample_index: int, reward: float,
                    versions: Sequence[int] | int, generated_tokens: int = 64, context_tokens: int = 32, turns: int = 2,
                    duration_s: float = 10.0, started_at: float = 1_700_000_000.0,
                    rng: random.Random | None = None) -> wire.Trajectory:
    """One agent trajectory; ``versions`` is one policy version, or one per generated token."""
    rng = rng or random.Random(f"{group_id}/{sample_index}")
    per_turn = max(1, generated_tokens // max(1, turns))
    if isinstance(versions, int):
        versions = [versions] * generated_tokens
    if len(versions) != generated_tokens:
        raise ValueError(f"{len(versions)} versions for {generated_tokens} generated tokens")
    segment_turns = [wire.Turn(role="system", tokens=pack_u32(rng.randrange(VOCAB) for _ in range(context_tokens)))]
    done = 0
    turn = 0
    while done < generated_tokens:
        count = min(per_turn, generated_tokens - done) if turn < turns - 1 else generated_tokens - done
        kept = []
        for _ in range(count):
            size = 1 if rng.random() < 0.6 else rng.randint(2, 8)
            kept.append(rng.sample(range(VOCAB), size))
        span = wire.GeneratedSpan.build([row[0] for row in kept], [0.0 if len(row) == 1 else -rng.random() for row in kept],
                                        list(versions[done:done + count]), kept=kept, engine_id="engine-0",
                                        finish_reason="tool_call")
        call = wire.ToolCall(id=f"call-{turn}", name="bash", arguments={"command": "pytest -x"})
        segment_turns.append(wire.Turn(role="assistant", generated=span, tool_calls=[call]))
        segment_turns.append(wire.Turn(role="tool", tokens=pack_u32(rng.randrange(VOCAB) for _ in range(8)),
                                       tool_results=[wire.ToolResult(call_id=call.id, output="ok")]))
        done += count
        turn += 1
    return wire.Trajectory(
        trajectory_id=f"{group_id}/{sample_index}", task_id=task_id, group_id=group_id, sample_index=sample_index,
        segments=[wire.TrajectorySegment(turns=segment_turns)], reward=reward,
        timings=wire.Timings(started_at=started_at, finished_at=started_at + duration_s))


def make_group(group_id: str, *, task_id: str = "task-0", rewards: Sequence[float] = (0.0, 1.0, 0.0, 1.0),
               version: int | Sequence[int] = 0, generated_tokens: int = 64, context_tokens: int = 32, turns: int = 2,
               duration_s: float = 10.0, metadata: dict[str, str] | None = None) -> wire.Group:
    """A scored group of ``len(rewards)`` trajectories.

    ``version`` is the policy version of every token, or one version per trajectory (its tokens
    then span that version only); ``duration_s`` is every trajectory's wall-clock duration.
    """
    versions = [version] * len(rewards) if isinstance(version, int) else list(version)
    if len(versions) != len(rewards):
        raise ValueError(f"{len(versions)} versions for {len(rewards)} trajectories")
    trajectories = [make_trajectory(task_id=task_id, group_id=group_id, sample_index=index, reward=reward,
                                    versions=versions[index], generated_tokens=generated_tokens,
                                    context_tokens=context_tokens, turns=turns, duration_s=duration_s)
                    for index, reward in enumerate(rewards)]
    return wire.Group(group_id=group_id, task_id=task_id, trajectories=trajectories, metadata=dict(metadata or {}))
