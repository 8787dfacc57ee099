"""An advantage estimator: each trajectory's reward minus its group's median reward.

Estimators get one reward and one group id per trajectory and return one advantage per trajectory,
counting the groups whose rewards are all equal (they carry no learning signal).
"""

from __future__ import annotations

import torch

from relayrl.algo.advantages import AdvantageResult
from relayrl.core.config import Section


class MedianBaseline:
    """``r - median(r of the group)``: robust to one outlier reward in a group."""

    class Config(Section, kw_only=True):
        scale: float = 1.0
        """Multiplies every advantage."""

    def __init__(self, config: MedianBaseline.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> AdvantageResult:
        advantages = torch.zeros_like(rewards, dtype=torch.float32)
        groups = torch.unique(group_ids)
        constant = 0
        for group in groups:
            members = group_ids == group
            values = rewards[members].float()
            advantages[members] = self.config.scale * (values - values.median())
            constant += int(bool((values == values[0]).all()))
        return AdvantageResult(advantages=advantages, num_groups=len(groups), zero_variance_groups=constant)
