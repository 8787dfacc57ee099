"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the hooks, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import LossFactory

NAME = "relayrl-template"


@hookimpl
def relayrl_algo_losses() -> Iterator[Registration[LossFactory]]:
    """Register the loss, so ``[algo] loss = "relayrl-template"`` selects it."""
    from relayrl_template.loss import PolicyGradient

    yield Registration(NAME, PolicyGradient, "importance-weighted policy gradient (template plugin)",
                       config=PolicyGradient.Config)
