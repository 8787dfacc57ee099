"""relayrl-core's own plugin: the built-in store backends and the ``[run]``/``[store]`` config sections."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.core.config import Section
    from relayrl.core.hookspecs import StoreFactory


@hookimpl
def relayrl_core_stores() -> Iterator[Registration[StoreFactory]]:
    from relayrl.core.store.backends import LocalStore, LocalStoreConfig, MemoryStore, S3Config, S3Store

    yield Registration("file", LocalStore.from_url, "local or shared POSIX directory (temp file, fsync, rename)",
                       config=LocalStoreConfig)
    yield Registration("memory", MemoryStore.from_url, "fsspec's in-process memory filesystem (one process only)")
    yield Registration("s3", S3Store.from_url, "S3 and S3-compatible servers via s3fs (conditional put)",
                       config=S3Config)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[type[Section]]]:
    from relayrl.core.config import RunSection, StoreSection

    yield Registration("run", RunSection, "run name, seed, determinism")
    yield Registration("store", StoreSection, "the object store that serves as the bus")
