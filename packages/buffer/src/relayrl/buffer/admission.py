"""Admission policies: which ingested groups may be trained on, and with what weight.

A policy looks at one :class:`~relayrl.buffer.groups.PendingGroup` and the trainer's current
policy version and returns an :class:`Admission`: keep with a weight (1.0 normally), or drop with a
reason. Policies are pure functions of their inputs; the buffer evaluates them when it forms a
batch (staleness grows while a group waits), and may evaluate a group more than once.

Built in (registry ``relayrl_buffer_admission_policies``):

``staleness``
    staleness = trainer version - oldest policy version of any token in the group (the group is as
    off-policy as its oldest token). Up to ``max_staleness``: admitted. Beyond it: dropped
    (``stale``), or with ``action = "down-weight"`` kept at weight ``decay ** excess`` for
    ``down_weight_window`` versions and dropped after that. Tokens from a version *newer* than the
    trainer (a trainer restored from a checkpoint older than weights it had already published) are
    dropped as ``future_version``: no trainer state ever produced them.
``zero-variance``
    All rewards equal (within a tolerance): every group-relative advantage is zero, so the group
    has no learning signal and would only cost compute. Dropped as ``zero_variance``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from relayrl.buffer.config import BufferSection
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.hookspecs import ADMISSION_POLICIES
from relayrl.core.plugins import PluginManager

if TYPE_CHECKING:
    pass



@dataclasses.dataclass(frozen=True)
class Admission:
    """A policy's verdict on one group."""

    weight: float = 1.0
    """Multiplier of the group's loss weight (1.0 = unchanged)."""
    drop_reason: str | None = None
    """Set when the group must not be trained on; a short, stable metric name (``stale``)."""
    weight_reason: str | None = None
    """Set when ``weight`` < 1: why it was down-weighted."""

    @property
    def dropped(self) -> bool:
        return self.drop_reason is not None


ADMIT = Admission()


class AdmissionPolicy(Protocol):
    """What an admission policy provides (see the module docstring for the contract)."""

    def admit(self, group: PendingGroup, trainer_version: int) -> Admission: ...


@dataclasses.dataclass(frozen=True)
class StalenessPolicy:
    """Bounded staleness: admit, down-weight or drop by ``trainer_version - oldest token version``."""

    max_staleness: int = 4
    action: str = "drop"
    down_weight_decay: float = 0.5
    down_weight_window: int = 4

    @classmethod
    def from_config(cls, config: BufferSection) -> StalenessPolicy:
        section = config.staleness
        return cls(section.max_staleness, section.action, section.down_weight_decay, section.down_weight_window)

    def admit(self, group: PendingGroup, trainer_version: int) -> Admission:
        staleness = group.staleness(trainer_version)
        if staleness is None:
            return Admission(drop_reason="no_generated_tokens")
        if staleness < 0:
            return Admission(drop_reason="future_version")
        excess = staleness - self.max_staleness
        if excess <= 0:
            return ADMIT
        if self.action == "down-weight" and excess <= self.down_weight_window:
            return Admission(weight=self.down_weight_decay ** excess, weight_reason="stale")
        return Admission(drop_reason="stale")


@dataclasses.dataclass(frozen=True)
class ZeroVariancePolicy:
    """Drop groups whose rewards are all equal: their group-relative advantages are all zero."""

    tolerance: float = 1e-6

    @classmethod
    def from_config(cls, config: BufferSection) -> ZeroVariancePolicy:
        return cls(config.zero_variance_tolerance)

    def admit(self, group: PendingGroup, trainer_version: int) -> Admission:
        rewards = group.group.rewards
        if not rewards or max(rewards) - min(rewards) <= self.tolerance:
            return Admission(drop_reason="zero_variance")
        return ADMIT


class AdmissionChain:
    """Policies applied in order: the first drop wins; the weights of the others multiply."""

    def __init__(self, policies: Sequence[tuple[str, AdmissionPolicy]]) -> None:
        self.policies = list(policies)

    def admit(self, group: PendingGroup, trainer_version: int) -> Admission:
        weight, reasons = 1.0, []
        for name, policy in self.policies:
            verdict = policy.admit(group, trainer_version)
            if verdict.dropped:
                return verdict
            if verdict.weight != 1.0:
                if not 0.0 < verdict.weight <= 1.0:
                    raise ValueError(f"admission policy {name!r} returned weight {verdict.weight} for group "
                                     f"{group.ref}; weights must be in (0, 1] (drop instead of weighting 0)")
                weight *= verdict.weight
                reasons.append(verdict.weight_reason or name)
        if weight == 1.0:
            return ADMIT
        return Admission(weight=weight, weight_reason="+".join(reasons))


def build_admission(config: BufferSection, pm: PluginManager | None = None) -> AdmissionChain:
    """The chain of policies ``config.admission`` names, built from the registry."""
    chain = []
    for name in config.admission:
        record = ADMISSION_POLICIES.lookup(pm, name)
        chain.append((name, record.factory(config)))
    return AdmissionChain(chain)
