"""Group advantage estimators: GRPO, Dr.GRPO, RLOO.

An estimator maps the rewards of a batch of trajectories, each tagged with its group (the G
samples of one prompt), to one advantage per trajectory; the loss broadcasts it over the
trajectory's tokens. A group whose rewards are all equal carries no learning signal (every
advantage is 0): estimators count such groups so the trainer can report them, never hide them.

Formulas, for a group with rewards ``r_1 .. r_G`` and mean ``m``:

* ``grpo``:   ``A_i = (r_i - m) / (std(r) + eps)`` (``scale_by_std=false`` drops the division)
* ``drgrpo``: ``A_i = r_i - m`` (Dr.GRPO: no std scaling; pair with a constant-normalised loss)
* ``rloo``:   ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - m)`` (0 for G = 1)
"""

from __future__ import annotations

import dataclasses

import torch

from relayrl.core.config import Section

__all__ = ["GRPO", "RLOO", "AdvantageResult", "DrGRPO", "group_statistics"]


@dataclasses.dataclass(frozen=True)
class AdvantageResult:
    advantages: torch.Tensor
    """One advantage per trajectory, float32 ``[n]``."""
    num_groups: int
    zero_variance_groups: int
    """Groups whose rewards are all equal: no learning signal."""

    @property
    def metrics(self) -> dict[str, float]:
        advantages = self.advantages
        return {
            "advantage/mean": float(advantages.mean()) if advantages.numel() else 0.0,
            "advantage/std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
            "advantage/abs_max": float(advantages.abs().max()) if advantages.numel() else 0.0,
            "groups/total": float(self.num_groups),
            "groups/zero_variance": float(self.zero_variance_groups),
        }


def group_statistics(rewards: torch.Tensor, group_ids: torch.Tensor, *, unbiased: bool
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-trajectory group mean, group std, group size, and the group index of each trajectory."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    rewards = rewards.double()  # sums of many rewards: keep the centring exact enough to be 0 when it should
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    size = torch.zeros(groups, dtype=torch.float64).index_add(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(groups, dtype=torch.float64).index_add(0, inverse, rewards) / size
    deviation = rewards - mean[inverse]
    square = torch.zeros(groups, dtype=torch.float64).index_add(0, inverse, deviation * deviation)
    denominator = (size - 1).clamp(min=1) if unbiased else size
    std = (square / denominator).sqrt()
    return mean[inverse], std[inverse], size[inverse], inverse


def _constant_groups(rewards: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Boolean per group: all rewards of the group are equal."""
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    high = torch.full((groups,), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, inverse, rewards.double(), reduce="amax", include_self=True)
    low = torch.full((groups,), float("inf"), dtype=torch.float64).scatter_reduce(
        0, inverse, rewards.double(), reduce="amin", include_self=True)
    return high == low


class GRPO:
    """Group mean-centred rewards, optionally divided by the group's standard deviation."""

    class Config(Section, kw_only=True):
        scale_by_std: bool = True
        """Divide by the group std (GRPO); false gives Dr.GRPO-style centring."""
        unbiased_std: bool = True
        """Sample (n - 1) std, as TRL and verl compute it."""
        eps: float = 1e-6
        """Added to the std; zero-variance groups get advantage 0 whatever eps is."""

    def __init__(self, config: GRPO.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> AdvantageResult:
        mean, std, _, inverse = group_statistics(rewards, group_ids, unbiased=self.config.unbiased_std)
        advantages = rewards.double() - mean
        if self.config.scale_by_std:
            advantages = advantages / (std + self.config.eps)
        return _result(advantages, rewards, inverse)


class DrGRPO(GRPO):
    """Mean-centred rewards without std scaling (Dr.GRPO); use with ``aggregation = "constant"``."""

    class Config(Section, kw_only=True):
        pass

    def __init__(self, config: DrGRPO.Config | None = None) -> None:
        super().__init__(GRPO.Config(scale_by_std=False))


class RLOO:
    """Leave-one-out baseline: each sample is compared with the mean of the others in its group."""

    class Config(Section, kw_only=True):
        pass

    def __init__(self, config: RLOO.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> AdvantageResult:
        mean, _, size, inverse = group_statistics(rewards, group_ids, unbiased=False)
        scale = torch.where(size > 1, size / (size - 1).clamp(min=1), torch.zeros_like(size))
        return _result(scale * (rewards.double() - mean), rewards, inverse)


def _result(advantages: torch.Tensor, rewards: torch.Tensor, inverse: torch.Tensor) -> AdvantageResult:
    constant = _constant_groups(rewards, inverse)
    # Exactly 0 for constant groups: (r - mean) can be 1e-17 rather than 0 in floating point, and
    # dividing by (std + eps) would blow it up to a spurious signal.
    advantages = torch.where(constant[inverse], torch.zeros_like(advantages), advantages)
    return AdvantageResult(advantages.float(), int(constant.numel()), int(constant.sum()))
