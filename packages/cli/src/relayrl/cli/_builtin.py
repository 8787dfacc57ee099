"""The ``relayrl`` command's own plugin: its hookspecs, the ``[launcher]`` section, the local launcher."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.cli.hookspecs import LauncherFactory


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.cli import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.cli.config import LauncherSection

    yield Registration("launcher", LauncherSection, "where the run's processes execute: this machine, or a cluster")


@hookimpl
def relayrl_cli_launchers() -> Iterator[Registration[LauncherFactory]]:
    from relayrl.cli.run.local_backend import LocalBackend

    yield Registration("local", LocalBackend.create, "every process on this machine, supervised by relayrl run")
