"""``LossTests``: the conformance suite every policy loss passes, built in or plugin.

Subclass it and override the ``loss`` fixture::

    from relayrl.algo.testing import LossTests

    class TestMyLoss(LossTests):
        @pytest.fixture
        def loss(self):
            return MyLoss(MyLoss.Config())

Every test drives the loss through the real pipeline: logits → :func:`sample_tokens` (top-p, so
kept-sets vary from singletons to dozens) → :func:`replay_logprobs` → the loss → ``backward`` to
the logits. The properties checked are the ones a long RL run depends on: finite gradients, no
gradient without advantage, the right sign, nothing from singleton kept-sets, padding changes
nothing, masked tokens get nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relayrl.algo.losses import AGGREGATIONS, Loss, LossInputs
from relayrl.algo.sampling import KeptSets, replay_logprobs, sample_tokens


@dataclasses.dataclass
class ReplayBatch:
    """A ``[B, L]`` batch whose logprobs are replayed from leaf ``logits`` ``[B * L, V]``."""

    logits: torch.Tensor
    tokens: torch.Tensor
    kept: KeptSets
    mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    shape: tuple[int, int]

    def replayed(self) -> torch.Tensor:
        return replay_logprobs(self.logits, self.tokens, self.kept).view(self.shape)

    def inputs(self, advantages: torch.Tensor, *, old_shift: float = 0.0) -> LossInputs:
        """Loss inputs at the current logits; ``old_logprobs`` = replayed (detached) + ``old_shift``."""
        logprobs = self.replayed()
        return LossInputs(logprobs=logprobs, old_logprobs=logprobs.detach() + old_shift, advantages=advantages,
                          mask=self.mask)


def make_replay_batch(*, seed: int = 0, batch: int = 4, length: int = 9, vocab: int = 50, top_p: float = 0.9,
                      top_k: int = 0, pad_columns: int = 2, scale: float = 2.0) -> ReplayBatch:
    """Random logits, tokens sampled with kept-sets, and a mask whose last ``pad_columns`` are padding."""
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch * length, vocab, generator=generator) * scale).requires_grad_()
    sample = sample_tokens(logits.detach(), top_p=top_p, top_k=top_k, generator=generator)
    mask = torch.ones(batch, length)
    if pad_columns:
        mask[:, -pad_columns:] = 0
        mask[0, :] = 1  # one full-length row, the rest padded
    return ReplayBatch(logits, sample.tokens, sample.kept, mask, sample.logprobs.view(batch, length), (batch, length))


def _signs(batch: int) -> torch.Tensor:
    return torch.tensor([1.0 if index % 2 == 0 else -1.0 for index in range(batch)])


class LossTests:
    """Conformance suite for policy losses (``loss(inputs: LossInputs) -> LossOutput``)."""

    @pytest.fixture
    def loss(self):
        raise NotImplementedError("override the `loss` fixture to return the loss under test")

    def test_it_declares_how_it_aggregates(self, loss) -> None:
        # The trainer normalises over the whole batch by this mode (relayrl.algo.losses.Loss).
        assert isinstance(loss, Loss) and loss.aggregation in AGGREGATIONS
        if loss.aggregation == "constant":
            assert loss.normalizer and loss.normalizer > 0

    def test_loss_and_gradients_are_finite(self, loss) -> None:
        data = make_replay_batch(seed=1)
        output = loss(data.inputs(torch.randn(4), old_shift=0.05))
        output.loss.backward()
        assert output.loss.dim() == 0 and torch.isfinite(output.loss)
        assert torch.isfinite(data.logits.grad).all()
        assert all(isinstance(value, float) for value in output.metrics.values())

    def test_zero_advantage_gives_exactly_zero_gradient(self, loss) -> None:
        data = make_replay_batch(seed=2)
        loss(data.inputs(torch.zeros(4), old_shift=0.05)).loss.backward()
        assert torch.count_nonzero(data.logits.grad) == 0

    def test_gradient_step_moves_logprobs_with_the_advantage_sign(self, loss) -> None:
        data = make_replay_batch(seed=3)
        advantages = _signs(4)
        before = data.replayed().detach()
        loss(data.inputs(advantages)).loss.backward()
        with torch.no_grad():
            data.logits -= 0.05 * data.logits.grad
        change = (data.replayed().detach() - before) * data.mask
        per_sequence = change.sum(dim=1)
        assert (per_sequence * advantages > 0).all(), f"logprob changes {per_sequence} vs advantages {advantages}"

    def test_singleton_kept_sets_contribute_no_gradient(self, loss) -> None:
        data = make_replay_batch(seed=4, top_k=1)  # every kept-set is the argmax alone
        assert bool((data.kept.counts() == 1).all())
        loss(data.inputs(_signs(4), old_shift=0.0)).loss.backward()
        assert torch.count_nonzero(data.logits.grad) == 0

    def test_singleton_rows_get_no_gradient_in_a_mixed_batch(self, loss) -> None:
        data = make_replay_batch(seed=5, top_p=0.6, scale=4.0, pad_columns=0)
        singletons = data.kept.counts() == 1
        assert 0 < int(singletons.sum()) < singletons.numel(), "the batch must mix singleton and larger kept-sets"
        loss(data.inputs(_signs(4), old_shift=0.02)).loss.backward()
        assert torch.count_nonzero(data.logits.grad[singletons]) == 0
        assert torch.count_nonzero(data.logits.grad[~singletons]) > 0

    def test_padding_changes_nothing(self, loss) -> None:
        data = make_replay_batch(seed=6, pad_columns=0, batch=3, length=5)
        advantages = torch.tensor([0.7, -1.3, 0.4])
        base = loss(data.inputs(advantages, old_shift=0.03))
        base.loss.backward()
        base_grad = data.logits.grad.clone()

        # The same batch with two padding columns of garbage and one all-padding row.
        logprobs = data.replayed()
        garbage = torch.randn(3, 2) - 5.0
        padded_logprobs = torch.cat([torch.cat([logprobs, garbage], dim=1), torch.full((1, 7), -3.0)])
        padded_old = torch.cat([torch.cat([logprobs.detach() + 0.03, garbage + 1.0], dim=1), torch.full((1, 7), -1.0)])
        padded_mask = torch.cat([torch.cat([torch.ones(3, 5), torch.zeros(3, 2)], dim=1), torch.zeros(1, 7)])
        padded = LossInputs(logprobs=padded_logprobs, old_logprobs=padded_old,
                            advantages=torch.cat([advantages, torch.tensor([2.0])]), mask=padded_mask)
        data.logits.grad = None
        output = loss(padded)
        output.loss.backward()
        torch.testing.assert_close(output.loss, base.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(data.logits.grad, base_grad, rtol=1e-6, atol=1e-8)

    def test_masked_tokens_get_no_gradient(self, loss) -> None:
        data = make_replay_batch(seed=7, pad_columns=3)
        loss(data.inputs(_signs(4), old_shift=0.02)).loss.backward()
        masked_rows = (data.mask.reshape(-1) == 0)
        assert torch.count_nonzero(data.logits.grad[masked_rows]) == 0
