"""A mismatch correction: importance weights ``rho = p_trainer / p_engine``, softly capped.

Corrections get the trainer's recomputed logprobs of the behaviour policy, the engine's recorded
logprobs and the mask, and return detached per-token weights, the tokens still counted, and metrics.
"""

from __future__ import annotations

import torch

from relayrl.algo.correction import CorrectionResult, MismatchInputs, mismatch_metrics
from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager


class SoftCap:
    """``w = cap * tanh(rho / cap)``: about rho when rho is small, never above ``cap``."""

    class Config(Section, kw_only=True):
        cap: float = 2.0

        def check(self, pm: PluginManager | None, path: str) -> None:
            if self.cap <= 0:
                raise ConfigError(f"{path}.cap: must be > 0, got {self.cap}")

    def __init__(self, config: SoftCap.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        mask = inputs.mask.to(torch.float32)
        rho = ((inputs.old_logprobs.detach().float() - inputs.behavior_logprobs.float()) * mask).exp()
        # tanh(x) / x -> 1 as x -> 0: exactly 1 when nothing differs, so no mismatch changes nothing.
        x = rho / self.config.cap
        weights = torch.where(rho == 1.0, torch.ones_like(rho), self.config.cap * torch.tanh(x))
        return CorrectionResult((weights * mask).detach(), inputs.mask, mismatch_metrics(inputs))
