"""relayrl-weight-sync's own plugin: its hookspecs, the built-in codecs and the ``[weight_sync]`` section."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


@hookimpl
def relayrl_addhooks(pluginmanager):
    from relayrl.weight_sync import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_weight_sync_codecs():
    from relayrl.weight_sync.codecs import BUILTIN_CODECS

    for name, (factory, description) in BUILTIN_CODECS.items():
        yield Registration(name, factory, description)


@hookimpl
def relayrl_core_config_sections():
    from relayrl.weight_sync.config import WeightSyncSection

    yield Registration("weight_sync", WeightSyncSection, "weight publishing, codecs, controllers, retention")
