"""The plugin's registration: the ``reasoning-gym`` environment."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.environment import EnvironmentFactory

NAME = "reasoning-gym"


@hookimpl
def relayrl_rollout_environments() -> Iterator[Registration[EnvironmentFactory]]:
    from relayrl_reasoning_gym.environment import ReasoningGymEnvironment

    yield Registration(NAME, ReasoningGymEnvironment,
                       "reasoning-gym datasets (one, or a weighted mix): each dataset's own score_answer, in a sandbox",
                       config=ReasoningGymEnvironment.Config)
