"""``AdvantageEstimatorTests`` and ``CorrectionTests``: the conformance suites of advantage
estimators and train/inference mismatch corrections, built in or plugin.

Subclass one and override its fixture::

    from relayrl.algo.testing import AdvantageEstimatorTests, CorrectionTests

    class TestMyEstimator(AdvantageEstimatorTests):
        @pytest.fixture
        def estimator(self):
            return MyEstimator(MyEstimator.Config())

    class TestMyCorrection(CorrectionTests):
        @pytest.fixture
        def correction(self):
            return MyCorrection(MyCorrection.Config())

The properties are the ones group-relative RL relies on, whatever the estimator's formula: one
finite advantage per trajectory; a group whose rewards are all equal carries no signal (zero
advantages, counted); within a group a higher reward never gets a lower advantage; a group's
advantages depend on its own rewards only, not on the other groups of the batch or their order.
A correction returns detached, finite, non-negative per-token weights and a mask within the input
mask; with no mismatch at all it changes nothing.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.algo.correction import MismatchInputs


def grouped_rewards(groups: int = 5, size: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rewards in [0, 1] (with ties) for ``groups`` interleaved groups of ``size``."""
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 5, (groups * size,), generator=generator).float() / 4
    group_ids = torch.arange(groups).repeat(size)  # interleaved: a group's members are not adjacent
    return rewards, group_ids


class AdvantageEstimatorTests:
    """Conformance suite for advantage estimators (``estimator(rewards, group_ids) -> AdvantageResult``)."""

    @pytest.fixture
    def estimator(self):
        raise NotImplementedError("override the `estimator` fixture to return the estimator under test")

    def test_one_finite_float_advantage_per_trajectory(self, estimator) -> None:
        rewards, group_ids = grouped_rewards()
        result = estimator(rewards, group_ids)
        assert result.advantages.shape == rewards.shape and result.advantages.is_floating_point()
        assert torch.isfinite(result.advantages).all() and result.num_groups == 5

    def test_equal_rewards_carry_no_signal_and_are_counted(self, estimator) -> None:
        rewards, group_ids = grouped_rewards()
        rewards[group_ids == 2] = 0.75
        rewards[group_ids == 4] = 0.0
        result = estimator(rewards, group_ids)
        assert torch.equal(result.advantages[(group_ids == 2) | (group_ids == 4)],
                           torch.zeros(8, dtype=result.advantages.dtype))
        varied = sum(len(set(rewards[group_ids == group].tolist())) > 1 for group in range(5))
        assert result.zero_variance_groups == 5 - varied

    def test_a_higher_reward_never_gets_a_lower_advantage_in_its_group(self, estimator) -> None:
        for seed in range(5):
            rewards, group_ids = grouped_rewards(seed=seed)
            advantages = estimator(rewards, group_ids).advantages
            for group in range(5):
                members = group_ids == group
                order = torch.argsort(rewards[members], stable=True)
                assert (torch.diff(advantages[members][order]) >= -1e-6).all(), (seed, group)

    def test_a_groups_advantages_depend_on_its_own_rewards_only(self, estimator) -> None:
        rewards, group_ids = grouped_rewards()
        base = estimator(rewards, group_ids).advantages
        changed = rewards.clone()
        changed[group_ids == 0] = 1.0 - changed[group_ids == 0]  # another group's rewards change
        others = group_ids != 0
        torch.testing.assert_close(estimator(changed, group_ids).advantages[others], base[others])
        permutation = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(3))
        shuffled = estimator(rewards[permutation], group_ids[permutation]).advantages
        torch.testing.assert_close(shuffled, base[permutation])  # the batch's order does not matter


class CorrectionTests:
    """Conformance suite for mismatch corrections (``correction(MismatchInputs) -> CorrectionResult``)."""

    @pytest.fixture
    def correction(self):
        raise NotImplementedError("override the `correction` fixture to return the correction under test")

    @staticmethod
    def inputs(*, mismatch: float = 0.3, seed: int = 0) -> MismatchInputs:
        """``[4, 12]`` tokens, the last 3 columns of three rows padding, engine logprobs off by up to
        ``mismatch`` nats, and some staleness."""
        generator = torch.Generator().manual_seed(seed)
        old = -torch.rand(4, 12, generator=generator) * 3
        behavior = old + mismatch * (torch.rand(4, 12, generator=generator) * 2 - 1)
        mask = torch.ones(4, 12)
        mask[1:, -3:] = 0
        return MismatchInputs(old_logprobs=old.requires_grad_(), behavior_logprobs=behavior, mask=mask,
                              staleness=torch.tensor([0, 1, 2, 4]))

    def test_weights_are_detached_finite_and_non_negative(self, correction) -> None:
        for mismatch in (0.0, 0.3, 3.0):  # none, typical, extreme
            data = self.inputs(mismatch=mismatch)
            result = correction(data)
            assert result.weights.shape == data.mask.shape and not result.weights.requires_grad
            assert torch.isfinite(result.weights).all() and (result.weights >= 0).all()
            assert all(isinstance(value, float) for value in result.metrics.values())

    def test_the_mask_stays_within_the_input_mask(self, correction) -> None:
        data = self.inputs(mismatch=3.0, seed=1)
        result = correction(data)
        assert result.mask.shape == data.mask.shape
        assert ((result.mask > 0) <= (data.mask > 0)).all()  # padding is never counted back in

    def test_no_mismatch_changes_nothing(self, correction) -> None:
        data = self.inputs(mismatch=0.0)
        result = correction(data)
        counted = data.mask > 0
        torch.testing.assert_close(result.weights[counted], torch.ones(int(counted.sum())))
        assert torch.equal(result.mask > 0, counted)
