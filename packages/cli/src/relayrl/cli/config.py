"""The ``[launcher]`` config section: which launcher places the run's processes."""

from __future__ import annotations

from typing import Any

import msgspec

from relayrl.core.config import Section, resolve_plugin
from relayrl.core.plugins import PluginManager

__all__ = ["LauncherSection"]


class LauncherSection(Section, kw_only=True):
    """``[launcher]``: where the run's processes execute (``relayrl_cli_launchers``).

    ``backend = "local"`` (the default) starts them on this machine; ``"ray"`` (the ``relayrl-ray``
    plugin) places them on a Ray cluster, configured by ``options`` (its address, the resources of
    each role...). ``relayrl run --launcher NAME`` is short for ``--set launcher.backend=NAME``.
    """

    backend: str = "local"
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    """The backend's own options, decoded into the struct its registration declares (errors name
    ``launcher.options.<key>``)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        from relayrl.cli.hookspecs import LAUNCHERS

        resolve_plugin(pm, LAUNCHERS, self.backend, self.options, path=f"{path}.backend", options_path=f"{path}.options")
