"""The alternating length penalty: a reward shaper that alternates unconstrained and budget phases.

In *unconstrained* phases rewards pass through: the policy optimises success only. In *budget*
phases a successful trajectory whose weighted cost

    cost = w_tokens * generated_tokens + w_turns * assistant_turns + w_tool_seconds * tool_seconds

exceeds ``budget`` loses ``coefficient * min(1, (cost - budget) / budget)``, but never falls below
``success_floor``: a penalised success is still worth more than a failure, so the penalty cannot
teach the policy to give up. Failures are never penalised unless ``apply_to_failures`` is set (and
a penalty only ever lowers a reward, so a failure can never become a success). Response lengths
then compress on tasks within the policy's reach while long-horizon behaviour on hard tasks,
trained in the unconstrained phases, survives.

The phase in force is a function of the trainer step (``schedule`` cycles), reported by
:meth:`AlternatingLengthPenalty.metrics` every step.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import Group, Trajectory

__all__ = ["AlternatingLengthPenalty", "Phase"]


class Phase(Section, kw_only=True):
    kind: Literal["unconstrained", "budget"]
    steps: int
    """Trainer steps the phase lasts before the schedule moves on (the schedule cycles)."""


class AlternatingLengthPenalty:
    """Reward shaper ``length-penalty``; see the module docstring."""

    class Config(Section, kw_only=True):
        schedule: list[Phase] = msgspec.field(default_factory=lambda: [
            Phase(kind="unconstrained", steps=100), Phase(kind="budget", steps=50)])
        budget: float = 8192.0
        """Weighted-cost budget; costs above it are penalised in budget phases."""
        w_tokens: float = 1.0
        w_turns: float = 0.0
        w_tool_seconds: float = 0.0
        coefficient: float = 0.3
        """Largest penalty (reached at twice the budget)."""
        success_threshold: float = 0.5
        """A trajectory succeeded when reward_components['success'] (or else its reward) reaches this."""
        success_floor: float = 0.5
        """A penalised success keeps at least this reward (set it above your failure reward)."""
        apply_to_failures: bool = False

        def check(self, pm: PluginManager | None, path: str) -> None:
            if not self.schedule or any(phase.steps <= 0 for phase in self.schedule):
                raise ConfigError(f"{path}.schedule: needs at least one phase, each with steps > 0")
            if self.budget <= 0:
                raise ConfigError(f"{path}.budget: must be > 0")

    def __init__(self, config: AlternatingLengthPenalty.Config | None = None) -> None:
        self.config = config or self.Config()
        self.config.check(None, "length_penalty")
        self._cycle = sum(phase.steps for phase in self.config.schedule)

    def phase(self, step: int) -> tuple[int, Phase]:
        """Index and phase in force at trainer step ``step``."""
        position = step % self._cycle
        for index, phase in enumerate(self.config.schedule):
            if position < phase.steps:
                return index, phase
            position -= phase.steps
        raise AssertionError("unreachable")

    def cost(self, trajectory: Trajectory) -> float:
        config = self.config
        return (config.w_tokens * trajectory.num_generated_tokens + config.w_turns * trajectory.num_turns
                + config.w_tool_seconds * trajectory.tool_seconds)

    def succeeded(self, trajectory: Trajectory) -> bool:
        score = trajectory.reward_components.get("success", trajectory.reward)
        return score >= self.config.success_threshold

    def shape_trajectory(self, trajectory: Trajectory, *, step: int) -> Trajectory:
        config = self.config
        cost = self.cost(trajectory)
        components = dict(trajectory.reward_components)
        components["length_cost"] = cost
        penalty = 0.0
        _, phase = self.phase(step)
        success = self.succeeded(trajectory)
        if phase.kind == "budget" and cost > config.budget and (success or config.apply_to_failures):
            penalty = config.coefficient * min(1.0, (cost - config.budget) / config.budget)
        reward = trajectory.reward - penalty
        if success and penalty:
            reward = max(reward, min(trajectory.reward, config.success_floor))
        components["length_penalty"] = reward - trajectory.reward
        return msgspec.structs.replace(trajectory, reward=reward, reward_components=components)

    def __call__(self, group: Group, *, step: int) -> Group:
        """The group with every trajectory's reward shaped; components record cost and penalty."""
        return msgspec.structs.replace(
            group, trajectories=[self.shape_trajectory(trajectory, step=step) for trajectory in group.trajectories])

    def metrics(self, step: int) -> dict[str, float]:
        index, phase = self.phase(step)
        return {"length_penalty/budget_phase": float(phase.kind == "budget"), "length_penalty/phase_index": float(index)}
