"""Losses: the conformance suite for each built-in, and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from relayrl.algo.losses import CISPO, GSPO, LossInputs, PPOClip, aggregate
from relayrl.algo.testing import LossTests


class TestPPOClip(LossTests):
    @pytest.fixture
    def loss(self):
        return PPOClip()


class TestPPOClipSequenceAggregation(LossTests):
    @pytest.fixture
    def loss(self):
        return PPOClip(PPOClip.Config(aggregation="seq-mean-token-sum"))


class TestGSPO(LossTests):
    @pytest.fixture
    def loss(self):
        return GSPO()


class TestCISPO(LossTests):
    @pytest.fixture
    def loss(self):
        return CISPO()


class TestCISPOConstant(LossTests):
    @pytest.fixture
    def loss(self):
        return CISPO(CISPO.Config(aggregation="constant", normalizer=64.0))


def one_sequence(advantage: float) -> LossInputs:
    logprobs = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    old = torch.log(torch.tensor([[0.4, 0.4]]))
    return LossInputs(logprobs=logprobs, old_logprobs=old, advantages=torch.tensor([advantage]), mask=torch.ones(1, 2))


def test_ppo_clip_by_hand():
    # ratio = [1.25, 0.5]; clip range [0.8, 1.28].
    positive = one_sequence(1.0)
    out = PPOClip()(positive)
    assert out.loss.item() == pytest.approx(-(1.25 + 0.5) / 2)
    out.loss.backward()
    # Both tokens on the unclipped branch: d/d logprob (-ratio * A) / 2 = -ratio / 2.
    assert positive.logprobs.grad[0].tolist() == pytest.approx([-1.25 / 2, -0.5 / 2])
    assert out.metrics["loss/clip_fraction"] == 0.0

    negative = one_sequence(-1.0)
    out = PPOClip()(negative)
    assert out.loss.item() == pytest.approx((1.25 + 0.8) / 2)
    out.loss.backward()
    assert negative.logprobs.grad[0, 1].item() == 0.0  # clipped at 0.8: no gradient
    assert out.metrics["loss/clip_low_fraction"] == 0.5 and out.metrics["loss/clip_high_fraction"] == 0.0


def test_ppo_clip_high_range_clips_positive_advantages():
    inputs = LossInputs(logprobs=torch.log(torch.tensor([[0.6]])).requires_grad_(),
                        old_logprobs=torch.log(torch.tensor([[0.4]])), advantages=torch.tensor([2.0]),
                        mask=torch.ones(1, 1))
    out = PPOClip(PPOClip.Config(clip_high=0.28))(inputs)
    assert out.loss.item() == pytest.approx(-1.28 * 2.0)  # ratio 1.5 clipped to 1.28
    out.loss.backward()
    assert inputs.logprobs.grad.item() == 0.0
    assert out.metrics["loss/clip_high_fraction"] == 1.0


def test_gspo_by_hand():
    inputs = one_sequence(1.0)
    out = GSPO()(inputs)
    sequence_ratio = math.sqrt(1.25 * 0.5)
    assert out.loss.item() == pytest.approx(-sequence_ratio, rel=1e-6)  # below 1 - 3e-4: unclipped for A > 0
    out.loss.backward()
    # Token gradient: -A * s / (tokens in sequence) per token, averaged over the one sequence.
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([-sequence_ratio / 2, -sequence_ratio / 2], rel=1e-6)


def test_cispo_by_hand():
    inputs = one_sequence(-2.0)
    out = CISPO()(inputs)
    expected = -(1.25 * -2.0 * math.log(0.5) + 0.5 * -2.0 * math.log(0.2)) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    out.loss.backward()
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([1.25 * 2.0 / 2, 0.5 * 2.0 / 2])
    capped = CISPO(CISPO.Config(eps_high=0.1))(one_sequence(1.0))
    assert capped.metrics["loss/clip_fraction"] == 0.5  # ratio 1.25 > 1.1


def test_is_weights_multiply_the_per_token_loss():
    inputs = one_sequence(1.0)
    weighted = LossInputs(logprobs=inputs.logprobs, old_logprobs=inputs.old_logprobs, advantages=inputs.advantages,
                          mask=inputs.mask, is_weights=torch.tensor([[2.0, 0.0]]))
    assert PPOClip()(weighted).loss.item() == pytest.approx(-(2.0 * 1.25) / 2)


def test_aggregation_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "constant", normalizer=20.0).item() == pytest.approx(0.5)
    assert aggregate(per_token, mask, "token-mean", denominator=8.0).item() == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="needs a positive normalizer"):
        aggregate(per_token, mask, "constant")
    with pytest.raises(ValueError, match="unknown aggregation 'bogus'"):
        aggregate(per_token, mask, "bogus")


def test_micro_batches_with_a_global_denominator_equal_the_full_batch():
    torch.manual_seed(0)
    logprobs = torch.randn(4, 6).clamp(max=0).requires_grad_()
    old = logprobs.detach() + 0.01 * torch.randn(4, 6)
    advantages = torch.randn(4)
    mask = (torch.rand(4, 6) > 0.3).float()
    loss = PPOClip()
    full = loss(LossInputs(logprobs=logprobs, old_logprobs=old, advantages=advantages, mask=mask)).loss
    total = float(mask.sum())
    parts = sum(loss(LossInputs(logprobs=logprobs[rows], old_logprobs=old[rows], advantages=advantages[rows],
                                mask=mask[rows], denominator=total)).loss for rows in (slice(0, 1), slice(1, 4)))
    torch.testing.assert_close(parts, full)


def test_inconsistent_shapes_are_refused():
    with pytest.raises(ValueError, match="advantages must be"):
        LossInputs(logprobs=torch.zeros(2, 3), old_logprobs=torch.zeros(2, 3), advantages=torch.zeros(3),
                   mask=torch.ones(2, 3))
