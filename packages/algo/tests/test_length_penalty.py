"""The alternating length penalty against hand-computed rewards."""

from __future__ import annotations

import pytest

from relayrl.algo.config import AlgoSection, build_reward_shapers
from relayrl.algo.length_penalty import AlternatingLengthPenalty, Phase
from relayrl.algo.testing import RewardShaperTests
from relayrl.core.config import ConfigError
from relayrl.core.wire import GeneratedSpan, Group, ToolResult, Trajectory, TrajectorySegment, Turn


def trajectory(tokens: int, reward: float, turns: int = 1, tool_seconds: float = 0.0) -> Trajectory:
    per_turn = tokens // turns
    segment_turns = []
    for index in range(turns):
        count = per_turn + (tokens - per_turn * turns if index == turns - 1 else 0)
        segment_turns.append(Turn(role="assistant", generated=GeneratedSpan.build([1] * count, [-0.1] * count, 0)))
    segment_turns.append(Turn(role="tool", tool_results=[ToolResult(call_id="c", wall_time_s=tool_seconds)]))
    return Trajectory(trajectory_id="t", task_id="task", group_id="g", sample_index=0,
                      segments=[TrajectorySegment(turns=segment_turns)], reward=reward)


def shaper(**overrides) -> AlternatingLengthPenalty:
    options = {"schedule": [Phase(kind="unconstrained", steps=2), Phase(kind="budget", steps=3)], "budget": 100.0,
               "coefficient": 0.4, **overrides}
    config = AlternatingLengthPenalty.Config(**options)
    return AlternatingLengthPenalty(config)


def test_phases_cycle_by_step():
    penalty = shaper()
    kinds = [penalty.phase(step)[1].kind for step in range(7)]
    assert kinds == ["unconstrained", "unconstrained", "budget", "budget", "budget", "unconstrained", "unconstrained"]
    assert penalty.metrics(3) == {"length_penalty/budget_phase": 1.0, "length_penalty/phase_index": 1.0}


def test_budget_phase_penalises_long_successes_only():
    penalty = shaper()
    long_success = penalty.shape_trajectory(trajectory(150, 1.0), step=2)
    # cost 150 > budget 100: penalty 0.4 * min(1, 50 / 100) = 0.2
    assert long_success.reward == pytest.approx(0.8)
    assert long_success.reward_components["length_penalty"] == pytest.approx(-0.2)
    assert long_success.reward_components["length_cost"] == 150.0
    assert penalty.shape_trajectory(trajectory(90, 1.0), step=2).reward == 1.0  # within budget
    assert penalty.shape_trajectory(trajectory(150, 1.0), step=0).reward == 1.0  # unconstrained phase
    failure = penalty.shape_trajectory(trajectory(400, 0.0), step=2)
    assert failure.reward == 0.0 and failure.reward_components["length_penalty"] == 0.0


def test_penalty_is_capped_and_never_drops_a_success_below_the_floor():
    penalty = shaper(coefficient=0.9, success_floor=0.5)
    shaped = penalty.shape_trajectory(trajectory(1000, 1.0), step=2)
    assert shaped.reward == pytest.approx(0.5)  # 1 - 0.9 would be 0.1: floored at 0.5


def test_failures_only_when_configured_and_never_upwards():
    penalty = shaper(apply_to_failures=True)
    shaped = penalty.shape_trajectory(trajectory(200, 0.0), step=2)
    assert shaped.reward == pytest.approx(-0.4)  # 0.4 * min(1, 100 / 100)
    for reward in (0.0, 0.3, 1.0):
        for tokens in (10, 150, 500):
            assert penalty.shape_trajectory(trajectory(tokens, reward), step=3).reward <= reward


def test_weighted_cost_over_tokens_turns_and_tool_time():
    penalty = shaper(w_tokens=0.5, w_turns=10.0, w_tool_seconds=2.0)
    assert penalty.cost(trajectory(40, 1.0, turns=3, tool_seconds=7.5)) == pytest.approx(0.5 * 40 + 10 * 3 + 2 * 7.5)


def test_success_component_takes_precedence_over_reward():
    segments = trajectory(150, 0.0).segments

    def shaped(reward, success):
        return shaper().shape_trajectory(Trajectory(trajectory_id="t", task_id="x", group_id="g", sample_index=0,
                                                    reward=reward, reward_components={"success": success},
                                                    segments=segments), step=2).reward

    assert shaped(1.0, 1.0) == pytest.approx(0.8)
    assert shaped(1.0, 0.0) == 1.0  # partial credit without success: not penalised
    assert shaped(0.45, 1.0) == 0.45  # already below the floor: a penalty would push it under failure level


def test_group_shaping_and_config_validation():
    penalty = shaper()
    group = Group(group_id="g", task_id="x", trajectories=[trajectory(150, 1.0), trajectory(50, 1.0)])
    assert [t.reward for t in penalty(group, step=2).trajectories] == pytest.approx([0.8, 1.0])
    with pytest.raises(ConfigError, match="schedule"):
        AlternatingLengthPenalty(AlternatingLengthPenalty.Config(schedule=[]))


class TestLengthPenaltyShaper(RewardShaperTests):
    """The built-in `length-penalty`, built from its registration with a budget the suite's groups
    exceed, over tokens, turns and tool time, in both phases of a short schedule."""

    steps = tuple(range(0, 24, 3))

    @pytest.fixture(params=[{}, {"apply_to_failures": True, "success_floor": 0.2}])
    def shaper(self, request):
        options = {"budget": 60.0, "w_turns": 5.0, "w_tool_seconds": 4.0,
                   "schedule": [{"kind": "unconstrained", "steps": 4}, {"kind": "budget", "steps": 5}], **request.param}
        return build_reward_shapers(AlgoSection(reward_shapers={"length-penalty": options}))[0]
