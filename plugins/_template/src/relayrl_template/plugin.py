"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the factories, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.core.hookspecs import StoreFactory

SCHEME = "relayrl-template"


@hookimpl
def relayrl_core_stores() -> Iterator[Registration[StoreFactory]]:
    """Register the dict store under its URL scheme, so ``open_store("relayrl-template://x")`` works."""
    from relayrl_template.store import DictStore

    yield Registration(SCHEME, DictStore.from_url, "objects in a Python dict (example plugin; one process only)")
