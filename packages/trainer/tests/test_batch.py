"""Laying trajectories out as training sequences, and splitting by token budget."""

from __future__ import annotations

import pytest
import torch

from relayrl.core.arrays import pack_u32
from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn
from relayrl.trainer.batch import build_sequences, split_by_token_budget


def span(tokens, version, kept=None):
    return GeneratedSpan.build(tokens, [-0.5] * len(tokens), version, kept=kept)


def trajectory(name, segments, reward=1.0):
    return Trajectory(trajectory_id=name, task_id="t", group_id="g", sample_index=0, reward=reward,
                      segments=[TrajectorySegment(turns=turns) for turns in segments])


def test_layout_of_a_two_turn_trajectory_by_hand():
    turns = [Turn(role="user", tokens=pack_u32([1, 2, 3])),
             Turn(role="assistant", tokens=pack_u32([4]), generated=span([10, 11], 5, kept=[[10, 12], [11]])),
             Turn(role="tool", tokens=pack_u32([7, 7])),
             Turn(role="assistant", tokens=pack_u32([4]), generated=span([20], 6, kept=[[20, 21, 22]]))]
    batch = build_sequences([Group(group_id="g", task_id="t", trajectories=[trajectory("a", [turns])])])
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 10, 11, 7, 7, 4, 20]]
    assert batch.target_mask[0].nonzero().squeeze(1).tolist() == [4, 5, 9]
    assert batch.versions[0].tolist() == [-1, -1, -1, -1, 5, 5, -1, -1, -1, 6]
    assert [batch.kept.row(i) for i in range(3)] == [[10, 12], [11], [20, 21, 22]]
    assert batch.behavior_logprobs[0, 4].item() == -0.5 and batch.behavior_logprobs[0, 0].item() == 0.0
    assert batch.staleness(8).tolist() == [3]  # trainer version 8, oldest token version 5


def test_segments_become_sequences_and_share_the_trajectory():
    first = [Turn(role="user", tokens=pack_u32([1])), Turn(role="assistant", generated=span([2, 3], 0))]
    second = [Turn(role="user", tokens=pack_u32([1, 9])), Turn(role="assistant", generated=span([4], 1))]
    groups = [Group(group_id="g0", task_id="t", trajectories=[trajectory("a", [first, second], 1.0),
                                                             trajectory("b", [first], 0.0)]),
              Group(group_id="g1", task_id="u", trajectories=[trajectory("c", [second], 0.5)])]
    batch = build_sequences(groups)
    assert batch.sequence_trajectory.tolist() == [0, 0, 1, 2]
    assert batch.group_ids.tolist() == [0, 0, 1]
    assert batch.rewards().tolist() == [1.0, 0.0, 0.5]
    assert batch.input_ids.tolist() == [[1, 2, 3], [1, 9, 4], [1, 2, 3], [1, 9, 4]]
    assert batch.kept.counts().tolist() == [0] * 6  # no kept-sets recorded: full vocabulary


def test_generated_token_at_position_zero_is_refused():
    bad = [Turn(role="assistant", generated=span([5], 0))]
    with pytest.raises(ValueError, match="position 0"):
        build_sequences([Group(group_id="g", task_id="t", trajectories=[trajectory("x", [bad])])])


def test_split_by_token_budget_covers_every_sequence_once():
    groups = []
    for index in range(7):
        turns = [Turn(role="user", tokens=pack_u32([1] * (index + 1))),
                 Turn(role="assistant", generated=span(list(range(2, 4 + index)), 0, kept=[[t] for t in range(2, 4 + index)]))]
        groups.append(Group(group_id=str(index), task_id="t", trajectories=[trajectory(str(index), [turns])]))
    batch = build_sequences(groups)
    parts = split_by_token_budget(batch, max_tokens=30)
    seen = sorted(row for rows, _ in parts for row in rows.tolist())
    assert seen == list(range(7))
    for rows, micro in parts:
        assert micro.input_ids.numel() <= 30 or len(rows) == 1
        assert micro.kept.rows == micro.num_targets
        for position, row in enumerate(rows.tolist()):
            length = int(batch.attention_mask[row].sum())
            assert torch.equal(micro.input_ids[position, :length], batch.input_ids[row, :length])
        # kept-sets follow their tokens: every target's kept-set is exactly [token]
        tokens = micro.input_ids[micro.target_mask].tolist()
        assert [micro.kept.row(i) for i in range(len(tokens))] == [[token] for token in tokens]
