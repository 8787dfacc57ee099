"""relayrl-core: plugin manager, wire schemas, config loading and object stores.

The pieces, each in its own module:

* :mod:`relayrl.core.plugins`: the pluggy project ``relayrl`` and typed registries;
* :mod:`relayrl.core.wire` and :mod:`relayrl.core.codec`: msgspec messages, msgpack + zstd;
* :mod:`relayrl.core.config`: TOML configs with path-named errors and ``--set`` overrides;
* :mod:`relayrl.core.store`: atomic, checksummed object stores over fsspec;
* :mod:`relayrl.core.testing`: conformance suites and fixtures.
"""

from relayrl.core.errors import (
    ChecksumMismatch,
    ConfigError,
    ObjectExists,
    ObjectNotFound,
    PluginError,
    RelayrlError,
    StoreError,
    WireError,
)
from relayrl.core.plugins import Registration, get_plugin_manager, hookimpl, hookspec, registrations
from relayrl.core.store import Store, open_store

__all__ = [
    "ChecksumMismatch", "ConfigError", "ObjectExists", "ObjectNotFound", "PluginError", "Registration",
    "RelayrlError", "Store", "StoreError", "WireError", "get_plugin_manager", "hookimpl", "hookspec",
    "open_store", "registrations",
]
