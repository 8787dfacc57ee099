"""Dual-clip PPO over replayed logprobs."""

from __future__ import annotations

import torch

from relayrl.algo.losses import Aggregation, ConfiguredLoss, LossInputs, LossOutput, aggregate
from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager


class DualClipPPO(ConfiguredLoss):
    """``-w * max(min(r A, clip(r) A), c A)`` for ``A < 0``; plain PPO-clip otherwise."""

    class Config(Section, kw_only=True):
        clip_low: float = 0.2
        clip_high: float = 0.28
        clip_ratio_c: float = 3.0
        """The dual-clip constant c (> 1): negative-advantage tokens lose at most c * |A|."""
        aggregation: Aggregation = "token-mean"
        normalizer: float | None = None

        def check(self, pm: PluginManager | None, path: str) -> None:
            if self.clip_ratio_c <= 1.0:
                raise ConfigError(f"{path}.clip_ratio_c: must be > 1, got {self.clip_ratio_c}")

    def __init__(self, config: DualClipPPO.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: LossInputs) -> LossOutput:
        config = self.config
        advantages = inputs.token_advantages
        ratio = (inputs.logprobs - inputs.old_logprobs).exp()
        clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
        surrogate = torch.minimum(ratio * advantages, clipped * advantages)
        dual = torch.where(advantages < 0, torch.maximum(surrogate, config.clip_ratio_c * advantages), surrogate)
        loss = aggregate(-inputs.weights * dual, inputs.mask, config.aggregation, normalizer=config.normalizer,
                         denominator=inputs.denominator)
        with torch.no_grad():
            mask = inputs.mask.to(ratio.dtype)
            lower_bound = ((advantages < 0) & (ratio * advantages < config.clip_ratio_c * advantages)).to(ratio.dtype)
            count = mask.sum().clamp(min=1.0)
            metrics = {"loss/dual_clip_fraction": float((lower_bound * mask).sum() / count),
                       "loss/ratio_mean": float((ratio * mask).sum() / count)}
        return LossOutput(loss, metrics)
