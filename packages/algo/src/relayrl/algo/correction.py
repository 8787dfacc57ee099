"""Train/inference mismatch correction by importance sampling, and its metrics.

The behaviour policy ``mu`` is what the inference engine actually sampled from (its recorded
logprobs, over the recorded kept-set); ``pi_old`` is the same policy version recomputed by the
trainer (replayed over the same kept-set). They differ by numerics (kernels, precision, batch
shapes) and, in asynchronous training, by the weights themselves when a rollout straddled an
update. Per token, ``log rho = log pi_old - log mu``. A correction turns ``rho`` into detached
weights ``w`` that multiply the loss, and may mask tokens or whole sequences out:

* ``none``: ``w = 1``.
* ``truncated``: ``w = min(rho, cap)`` (truncated IS).
* ``token-mask``: tokens with ``rho`` outside ``[lower, upper]`` are masked; kept tokens get
  ``w = rho`` (or 1 with ``reweight = false``).
* ``sequence-mask``: a sequence whose product ratio ``prod_t rho_t`` is outside ``[lower, upper]``
  is masked; kept sequences get ``w = prod_t rho_t`` per token (or 1).
* ``geometric-mask``: as ``sequence-mask`` on the geometric mean ``exp(mean_t log rho_t)``, which
  does not explode with length; kept tokens get ``w = min(rho, cap)`` (or 1).

Metrics (all masked to the counted tokens): mismatch KL of ``mu`` from ``pi_old`` estimated on
samples from ``mu`` with ``k1 = mean(log mu - log pi_old)`` and the non-negative
``k3 = mean(rho - 1 - log rho)``; ``rho`` mean/min/max; fractions masked and truncated.
Corrections receive each sequence's *staleness* (trainer version minus the oldest policy version
in it), so a policy can depend on it; the built-ins report it but do not use it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from relayrl.core.config import Section

__all__ = ["CorrectionResult", "GeometricMask", "MismatchInputs", "NoCorrection", "SequenceMask", "TokenMask",
           "TruncatedIS", "mismatch_metrics"]


@dataclasses.dataclass
class MismatchInputs:
    old_logprobs: torch.Tensor
    """``[B, L]`` trainer-recomputed logprobs of the behaviour policy's version (detached)."""
    behavior_logprobs: torch.Tensor
    """``[B, L]`` logprobs recorded by the inference engine at rollout time."""
    mask: torch.Tensor
    """``[B, L]``: tokens that count."""
    staleness: torch.Tensor | None = None
    """``[B]``: policy lag in versions of each sequence (trainer version - oldest token version)."""


@dataclasses.dataclass
class CorrectionResult:
    weights: torch.Tensor
    """``[B, L]`` detached weights that multiply the per-token loss."""
    mask: torch.Tensor
    """``[B, L]`` tokens still counted after masking."""
    metrics: dict[str, float]


def _log_ratio(inputs: MismatchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    mask = inputs.mask.to(torch.float32)
    log_rho = ((inputs.old_logprobs.detach().float() - inputs.behavior_logprobs.float()) * mask)
    return log_rho, mask


def mismatch_metrics(inputs: MismatchInputs) -> dict[str, float]:
    """Mismatch KL (k1, k3), mean |logprob difference| and ratio statistics over the counted tokens."""
    log_rho, mask = _log_ratio(inputs)
    count = mask.sum()
    if count == 0:
        return {"mismatch/kl_k1": 0.0, "mismatch/kl_k3": 0.0, "mismatch/abs_log_ratio": 0.0, "mismatch/ratio_mean": 1.0,
                "mismatch/ratio_min": 1.0, "mismatch/ratio_max": 1.0}
    rho = log_rho.exp()
    selected = mask > 0
    metrics = {
        "mismatch/kl_k1": float((-log_rho * mask).sum() / count),
        "mismatch/kl_k3": float(((rho - 1.0 - log_rho) * mask).sum() / count),
        "mismatch/abs_log_ratio": float((log_rho.abs() * mask).sum() / count),
        "mismatch/ratio_mean": float((rho * mask).sum() / count),
        "mismatch/ratio_min": float(rho[selected].min()),
        "mismatch/ratio_max": float(rho[selected].max()),
    }
    if inputs.staleness is not None and inputs.staleness.numel():
        metrics["staleness/mean"] = float(inputs.staleness.float().mean())
        metrics["staleness/max"] = float(inputs.staleness.max())
    return metrics


def _finish(weights: torch.Tensor, keep: torch.Tensor, inputs: MismatchInputs, *, truncated: torch.Tensor | None = None
            ) -> CorrectionResult:
    mask = inputs.mask.to(torch.float32)
    count = mask.sum().clamp(min=1.0)
    metrics = mismatch_metrics(inputs)
    metrics["mismatch/masked_fraction"] = float(((1.0 - keep) * mask).sum() / count)
    metrics["mismatch/truncated_fraction"] = float((truncated.float() * mask).sum() / count) if truncated is not None else 0.0
    return CorrectionResult((weights * keep).detach(), (mask * keep).to(inputs.mask.dtype), metrics)


class NoCorrection:
    """``w = 1``; still reports the mismatch metrics."""

    class Config(Section, kw_only=True):
        pass

    def __init__(self, config: NoCorrection.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        ones = torch.ones_like(inputs.mask, dtype=torch.float32)
        return _finish(ones, ones, inputs)


class TruncatedIS:
    """``w = min(rho, cap)``."""

    class Config(Section, kw_only=True):
        cap: float = 2.0
        """Upper bound on the per-token weight."""

    def __init__(self, config: TruncatedIS.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        log_rho, _ = _log_ratio(inputs)
        rho = log_rho.exp()
        return _finish(rho.clamp(max=self.config.cap), torch.ones_like(rho), inputs, truncated=rho > self.config.cap)


class TokenMask:
    """Mask tokens whose ratio leaves ``[lower, upper]``; weight the rest by their ratio (or 1)."""

    class Config(Section, kw_only=True):
        lower: float = 0.5
        upper: float = 2.0
        reweight: bool = True
        """Weight kept tokens by rho (true) or by 1 (pure rejection)."""

    def __init__(self, config: TokenMask.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        log_rho, _ = _log_ratio(inputs)
        rho = log_rho.exp()
        keep = ((rho >= self.config.lower) & (rho <= self.config.upper)).float()
        return _finish(rho if self.config.reweight else torch.ones_like(rho), keep, inputs)


class SequenceMask:
    """Mask whole sequences whose product ratio leaves ``[lower, upper]``."""

    class Config(Section, kw_only=True):
        lower: float = 0.5
        upper: float = 2.0
        reweight: bool = True
        """Weight kept sequences by their product ratio (true) or by 1."""

    def __init__(self, config: SequenceMask.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        log_rho, _ = _log_ratio(inputs)
        sequence_rho = log_rho.sum(dim=1).exp()
        keep_sequence = (sequence_rho >= self.config.lower) & (sequence_rho <= self.config.upper)
        keep = keep_sequence.float().unsqueeze(1).expand_as(log_rho)
        weights = sequence_rho.unsqueeze(1).expand_as(log_rho) if self.config.reweight else torch.ones_like(log_rho)
        return _finish(weights, keep, inputs)


class GeometricMask:
    """Mask sequences whose geometric-mean ratio leaves ``[lower, upper]``; truncated IS on the rest."""

    class Config(Section, kw_only=True):
        lower: float = 0.9
        upper: float = 1.1
        cap: float = 2.0
        """Per-token truncation of the weight of kept tokens."""
        reweight: bool = True

    def __init__(self, config: GeometricMask.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult:
        log_rho, mask = _log_ratio(inputs)
        geometric = (log_rho.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).exp()
        keep_sequence = (geometric >= self.config.lower) & (geometric <= self.config.upper)
        keep = keep_sequence.float().unsqueeze(1).expand_as(log_rho)
        rho = log_rho.exp()
        weights = rho.clamp(max=self.config.cap) if self.config.reweight else torch.ones_like(rho)
        return _finish(weights, keep, inputs, truncated=(rho > self.config.cap) & (keep > 0))


CorrectionKind = Literal["none", "truncated", "token-mask", "sequence-mask", "geometric-mask"]
