"""Policy losses over replayed logprobs: PPO-clip, GSPO, CISPO; and how per-token terms are aggregated.

Every loss takes a :class:`LossInputs` of padded ``[B, L]`` tensors (one row per generated span
or trajectory, ``mask`` marking the tokens that count) and returns a :class:`LossOutput`. The
``logprobs`` are the trainer's *replayed* logprobs (:func:`relayrl.algo.replay_logprobs`), so a
token with a singleton kept-set has logprob 0, ratio 1 and no gradient in every loss below.

Notation per token t of sequence i: ``ratio = exp(logprobs - old_logprobs)`` (current vs the
policy that the batch is trained from), ``A`` the advantage, ``w`` the mismatch-correction weight
(:mod:`relayrl.algo.correction`, detached, 1 when absent).

* ``ppo-clip``: ``l = -w * min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``;
  separate low/high ranges ("clip-higher" keeps low-probability tokens able to grow).
* ``gspo``: one ratio per sequence, ``s_i = exp(mean_t(logprobs - old_logprobs))``, used per token
  as ``s_i,t = sg(s_i) * exp(logprobs_t - sg(logprobs_t))`` (same value, token gradients), then
  ``l = -w * min(s * A, clip(s, 1 - clip_low, 1 + clip_high) * A)``; aggregate with
  ``seq-mean-token-mean`` to get GSPO's sequence objective.
* ``cispo``: ``l = -w * sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logprobs``: the IS weight
  is clipped and stopped, and every token keeps a gradient (none is clipped away).

Aggregation (``aggregation`` in every loss config) turns per-token terms into a scalar:

* ``token-mean``: ``sum(l * mask) / sum(mask)``;
* ``seq-mean-token-sum``: mean over sequences of ``sum_t l``;
* ``seq-mean-token-mean``: mean over sequences of ``mean_t l``;
* ``constant``: ``sum(l * mask) / normalizer`` (Dr.GRPO's fixed constant, no length bias).

Sequences without any counted token are ignored by the sequence means, so padding rows change
nothing. For gradient accumulation over micro-batches, set ``LossInputs.denominator`` to the
global count (tokens or sequences, as the mode needs) so every micro-batch divides by the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from relayrl.core.config import Section

__all__ = ["AGGREGATIONS", "CISPO", "GSPO", "ConfiguredLoss", "Loss", "LossInputs", "LossOutput", "PPOClip", "aggregate"]

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "constant"]
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "constant")


@dataclasses.dataclass
class LossInputs:
    """One micro-batch, padded to ``[B, L]``."""

    logprobs: torch.Tensor
    """Replayed logprobs under the current policy (requires grad)."""
    old_logprobs: torch.Tensor
    """Replayed logprobs under the policy the batch is trained from (detached)."""
    advantages: torch.Tensor
    """``[B]`` per sequence or ``[B, L]`` per token."""
    mask: torch.Tensor
    """``[B, L]``: 1 for tokens that count (generated, not padding, not masked by IS)."""
    is_weights: torch.Tensor | None = None
    """``[B, L]`` detached mismatch-correction weights; None means 1."""
    denominator: float | None = None
    """Global normaliser for gradient accumulation (token or sequence count, per the mode)."""

    def __post_init__(self) -> None:
        shape = self.logprobs.shape
        if self.logprobs.dim() != 2 or self.old_logprobs.shape != shape or self.mask.shape != shape:
            raise ValueError(f"logprobs, old_logprobs and mask must share one [B, L] shape; got "
                             f"{tuple(shape)}, {tuple(self.old_logprobs.shape)}, {tuple(self.mask.shape)}")
        if self.advantages.shape not in (shape, shape[:1]):
            raise ValueError(f"advantages must be [B] or [B, L]; got {tuple(self.advantages.shape)} for {tuple(shape)}")
        if self.is_weights is not None and self.is_weights.shape != shape:
            raise ValueError(f"is_weights must be [B, L]; got {tuple(self.is_weights.shape)}")

    @property
    def token_advantages(self) -> torch.Tensor:
        return self.advantages.unsqueeze(1).expand_as(self.logprobs) if self.advantages.dim() == 1 else self.advantages

    @property
    def weights(self) -> torch.Tensor:
        return torch.ones_like(self.logprobs) if self.is_weights is None else self.is_weights


@dataclasses.dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar to call ``backward()`` on."""
    metrics: dict[str, float]


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, normalizer: float | None = None,
              denominator: float | None = None) -> torch.Tensor:
    """Reduce ``[B, L]`` per-token terms to a scalar (see the module docstring for the modes)."""
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if mode == "token-mean":
        count = denominator if denominator is not None else mask.sum().clamp(min=1.0)
        return masked.sum() / count
    if mode == "constant":
        if not normalizer or normalizer <= 0:
            raise ValueError("aggregation 'constant' needs a positive normalizer (e.g. max tokens per batch)")
        return masked.sum() / normalizer
    tokens_per_sequence = mask.sum(dim=1)
    present = tokens_per_sequence > 0
    sequences = denominator if denominator is not None else present.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=1).sum() / sequences
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=1) / tokens_per_sequence.clamp(min=1.0)).sum() / sequences
    raise ValueError(f"unknown aggregation {mode!r} (known: {', '.join(AGGREGATIONS)})")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    return float((values * mask).sum() / count) if count > 0 else 0.0


class Loss:
    """The policy-loss contract (what ``relayrl_algo_losses`` factories return).

    ``loss(inputs) -> LossOutput``, and how it aggregates per-token terms: the trainer computes the
    aggregation's denominator over the whole batch (every micro-batch, every rank) and passes it in
    ``inputs.denominator``, so it must know the mode. Subclass it (or :class:`ConfiguredLoss`).
    """

    def __call__(self, inputs: LossInputs) -> LossOutput:
        raise NotImplementedError

    @property
    def aggregation(self) -> Aggregation:
        """One of :data:`AGGREGATIONS`."""
        return "token-mean"

    @property
    def normalizer(self) -> float | None:
        """The constant of ``aggregation = "constant"``."""
        return None


class ConfiguredLoss(Loss):
    """A loss whose ``config`` holds ``aggregation`` and ``normalizer`` (every built-in loss)."""

    config: Any

    @property
    def aggregation(self) -> Aggregation:
        return self.config.aggregation

    @property
    def normalizer(self) -> float | None:
        return self.config.normalizer


class _ClippedSurrogate(ConfiguredLoss):
    """Shared form of PPO-clip and GSPO: ``-w * min(s * A, clip(s) * A)``."""

    config: PPOClip.Config

    def _surrogate(self, ratio: torch.Tensor, inputs: LossInputs) -> LossOutput:
        config = self.config
        advantages = inputs.token_advantages
        clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
        per_token = -inputs.weights * torch.minimum(ratio * advantages, clipped * advantages)
        loss = aggregate(per_token, inputs.mask, config.aggregation, normalizer=config.normalizer,
                         denominator=inputs.denominator)
        with torch.no_grad():
            mask = inputs.mask.to(ratio.dtype)
            high = ((advantages > 0) & (ratio > 1.0 + config.clip_high)).to(ratio.dtype)
            low = ((advantages < 0) & (ratio < 1.0 - config.clip_low)).to(ratio.dtype)
            metrics = {
                "loss/clip_fraction": _masked_mean(high + low, mask),
                "loss/clip_high_fraction": _masked_mean(high, mask),
                "loss/clip_low_fraction": _masked_mean(low, mask),
                "loss/ratio_mean": _masked_mean(ratio, mask),
            }
        return LossOutput(loss, metrics)


class PPOClip(_ClippedSurrogate):
    """Token-level PPO-clip with separate low and high clip ranges."""

    class Config(Section, kw_only=True):
        clip_low: float = 0.2
        """Lower clip range: ratio is clipped at 1 - clip_low for negative advantages."""
        clip_high: float = 0.28
        """Upper clip range (DAPO's clip-higher): ratio is clipped at 1 + clip_high for positive advantages."""
        aggregation: Aggregation = "token-mean"
        normalizer: float | None = None
        """The constant for aggregation = "constant"."""

    def __init__(self, config: PPOClip.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: LossInputs) -> LossOutput:
        ratio = (inputs.logprobs - inputs.old_logprobs).exp()
        return self._surrogate(ratio, inputs)


class GSPO(_ClippedSurrogate):
    """Group Sequence Policy Optimisation: a length-normalised sequence ratio, clipped per sequence."""

    class Config(Section, kw_only=True):
        clip_low: float = 3e-4
        clip_high: float = 4e-4
        aggregation: Aggregation = "seq-mean-token-mean"
        normalizer: float | None = None

    def __init__(self, config: GSPO.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: LossInputs) -> LossOutput:
        mask = inputs.mask.to(inputs.logprobs.dtype)
        log_ratio = (inputs.logprobs - inputs.old_logprobs) * mask
        sequence_log_ratio = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        # Value: the sequence ratio s_i for every token; gradient: d logprobs_t, scaled by s_i.
        token_log_ratio = sequence_log_ratio.detach().unsqueeze(1) + inputs.logprobs - inputs.logprobs.detach()
        return self._surrogate(token_log_ratio.exp(), inputs)


class CISPO(ConfiguredLoss):
    """Clipped IS-weight policy optimisation: ``-sg(clip(ratio)) * A * logprob``, no token loses its gradient."""

    class Config(Section, kw_only=True):
        eps_low: float = 1.0
        """Lower bound 1 - eps_low on the IS weight (1.0: no lower bound, as in MiniMax-M1)."""
        eps_high: float = 2.0
        """Upper bound 1 + eps_high on the IS weight."""
        aggregation: Aggregation = "token-mean"
        normalizer: float | None = None

    def __init__(self, config: CISPO.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: LossInputs) -> LossOutput:
        config = self.config
        ratio = (inputs.logprobs - inputs.old_logprobs).detach().exp()
        weight = ratio.clamp(1.0 - config.eps_low, 1.0 + config.eps_high)
        per_token = -inputs.weights * weight * inputs.token_advantages * inputs.logprobs
        loss = aggregate(per_token, inputs.mask, config.aggregation, normalizer=config.normalizer,
                         denominator=inputs.denominator)
        mask = inputs.mask.to(ratio.dtype)
        clipped = ((ratio < 1.0 - config.eps_low) | (ratio > 1.0 + config.eps_high)).to(ratio.dtype)
        return LossOutput(loss, {"loss/clip_fraction": _masked_mean(clipped, mask),
                                 "loss/ratio_mean": _masked_mean(ratio, mask)})
