"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the hooks, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import MismatchCorrectionFactory

NAME = "relayrl-template"


@hookimpl
def relayrl_algo_mismatch_corrections() -> Iterator[Registration[MismatchCorrectionFactory]]:
    """Register the correction, so ``[algo] correction = "relayrl-template"`` selects it."""
    from relayrl_template.correction import SoftCap

    yield Registration(NAME, SoftCap, "importance weights softly capped with tanh (template plugin)",
                       config=SoftCap.Config)
