"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the hooks, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import AdvantageEstimatorFactory

NAME = "relayrl-template"


@hookimpl
def relayrl_algo_advantage_estimators() -> Iterator[Registration[AdvantageEstimatorFactory]]:
    """Register the estimator, so ``[algo] advantage = "relayrl-template"`` selects it."""
    from relayrl_template.advantage import MedianBaseline

    yield Registration(NAME, MedianBaseline, "reward minus the group's median (template plugin)",
                       config=MedianBaseline.Config)
