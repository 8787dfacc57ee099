"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from relayrl.algo.advantages import GRPO, RLOO, DrGRPO
from relayrl.algo.config import build
from relayrl.algo.hookspecs import ADVANTAGE_ESTIMATORS
from relayrl.algo.testing import AdvantageEstimatorTests


def test_grpo_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 3])
    result = GRPO()(rewards, groups)
    std = math.sqrt(4 * 0.25 / 3)  # sample std of [1, 0, 0, 1]
    expected = [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.5 / (std + 1e-6), 0.0, 0.0, 0.0]
    assert result.advantages.tolist() == pytest.approx(expected, rel=1e-6)
    assert result.num_groups == 2 and result.zero_variance_groups == 1


def test_grpo_population_std_and_no_scaling():
    rewards = torch.tensor([2.0, 0.0])
    groups = torch.tensor([0, 0])
    assert GRPO(GRPO.Config(unbiased_std=False, eps=0.0))(rewards, groups).advantages.tolist() == [1.0, -1.0]
    assert GRPO(GRPO.Config(scale_by_std=False))(rewards, groups).advantages.tolist() == [1.0, -1.0]
    assert DrGRPO()(rewards, groups).advantages.tolist() == [1.0, -1.0]


def test_rloo_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 9.0])
    groups = torch.tensor([0, 0, 0, 1, 2])
    result = RLOO()(rewards, groups)
    # r_i - mean of the others: 1 - 0, 0 - 0.5, 0 - 0.5; singleton groups get 0.
    assert result.advantages.tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0])
    assert result.zero_variance_groups == 2  # the two singletons


def test_constant_groups_are_exactly_zero_despite_rounding():
    rewards = torch.tensor([0.1, 0.1, 0.1])  # mean in floating point is not exactly 0.1
    result = GRPO(GRPO.Config(eps=1e-12))(rewards, torch.zeros(3, dtype=torch.long))
    assert result.advantages.tolist() == [0.0, 0.0, 0.0]
    assert result.metrics["groups/zero_variance"] == 1.0


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="must be equal 1-D"):
        GRPO()(torch.zeros(3), torch.zeros(2, dtype=torch.long))


class TestEveryBuiltinEstimator(AdvantageEstimatorTests):
    """Every registered estimator, with its default options, passes the suite a plugin passes."""

    @pytest.fixture(params=["grpo", "drgrpo", "rloo"])
    def estimator(self, request):
        return build(ADVANTAGE_ESTIMATORS, request.param, path="algo.advantage")
