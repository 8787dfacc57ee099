"""What a trajectory cost: generated tokens, turns, tool calls and tool time, counted from its turns.

The rollout manager's behaviour counters and an eval's records count the same way, here.
"""

from __future__ import annotations

import msgspec

from relayrl.core.wire import Trajectory

__all__ = ["Costs", "trajectory_costs"]


class Costs(msgspec.Struct, frozen=True, kw_only=True):
    """What one trajectory cost, counted from its turns."""

    generated_tokens: int = 0
    turns: int = 0
    """Assistant turns (summaries included)."""
    tool_calls: int = 0
    parallel_turns: int = 0
    """Turns that made two or more calls."""
    tool_results: int = 0
    tool_seconds: float = 0.0


def trajectory_costs(trajectory: Trajectory) -> Costs:
    """Tokens, turns, tool calls and tool time of ``trajectory`` (all its segments)."""
    turns = tool_calls = parallel = results = 0
    seconds = 0.0
    for segment in trajectory.segments:
        for turn in segment.turns:
            if turn.role == "assistant":
                turns += 1
                tool_calls += len(turn.tool_calls)
                parallel += len(turn.tool_calls) >= 2
            for result in turn.tool_results:
                results += 1
                seconds += float(result.wall_time_s)
    return Costs(generated_tokens=trajectory.num_generated_tokens, turns=turns, tool_calls=tool_calls,
                 parallel_turns=parallel, tool_results=results, tool_seconds=seconds)
