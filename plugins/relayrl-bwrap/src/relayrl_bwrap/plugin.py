"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): the backend module is
imported inside the hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.sandbox.hookspecs import SandboxBackendFactory

NAME = "bwrap"


@hookimpl
def relayrl_sandbox_backends() -> Iterator[Registration[SandboxBackendFactory]]:
    """Register the backend, so ``[sandbox] backend = "bwrap"`` selects it."""
    from relayrl_bwrap.backend import BwrapBackend

    yield Registration(NAME, BwrapBackend, "bubblewrap: read-only host, private tmpfs, --unshare-all, --die-with-parent")
