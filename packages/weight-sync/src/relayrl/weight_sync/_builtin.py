"""relayrl-weight-sync's own plugin: its hookspecs, the built-in codecs and the ``[weight_sync]`` section."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.weight_sync.hookspecs import CodecFactory


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.weight_sync import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_weight_sync_codecs() -> Iterator[Registration[CodecFactory]]:
    from relayrl.weight_sync.codecs import BUILTIN_CODECS

    for name, (factory, description) in BUILTIN_CODECS.items():
        yield Registration(name, factory, description)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.weight_sync.config import WeightSyncSection

    yield Registration("weight_sync", WeightSyncSection, "weight publishing, codecs, controllers, retention")
