"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): the loss module, which
imports torch, is imported inside the hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import LossFactory

NAME = "dual-clip"


@hookimpl
def relayrl_algo_losses() -> Iterator[Registration[LossFactory]]:
    """Register the loss, so ``[algo] loss = "dual-clip"`` selects it."""
    from relayrl_dualclip.loss import DualClipPPO

    yield Registration(NAME, DualClipPPO, "PPO-clip with a lower bound c * A on negative-advantage tokens (dual-clip)",
                       config=DualClipPPO.Config)
