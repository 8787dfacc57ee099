"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the hooks, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.hookspecs import HarnessFactory

NAME = "relayrl-template"


@hookimpl
def relayrl_rollout_harnesses() -> Iterator[Registration[HarnessFactory]]:
    """Register the harness, so ``[rollout] harness = "relayrl-template"`` selects it."""
    from relayrl_template.harness import ThinkThenAnswer

    yield Registration(NAME, ThinkThenAnswer, "think, then answer when asked (template plugin)",
                       config=ThinkThenAnswer.Config)
