"""Object stores: the bus every relayrl component exchanges data through.

``open_store(url)`` picks a backend by URL scheme from the ``relayrl_core_stores`` registry
(``file``, ``memory`` and ``s3`` are built in); a scheme no plugin registers falls back to the
generic fsspec backend when fsspec knows the protocol (``gs``, ``az`` ...). See
:class:`relayrl.core.store.base.Store` for the guarantees every backend gives.

Example::

    from relayrl.core.store import open_store

    store = open_store("file:///tmp/run")          # or "s3://bucket/run", "memory://run"
    store.put("weights/manifest-00000001", b"...", if_absent=True)
    data = store.get("weights/manifest-00000001")  # verified against its checksum
"""

from __future__ import annotations

from typing import Any

import fsspec

from relayrl.core.errors import StoreError
from relayrl.core.plugins import PluginManager
from relayrl.core.store.backends import FsspecStore, LocalStore, MemoryStore, S3Store
from relayrl.core.store.base import ObjectInfo, Store, validate_key
from relayrl.core.store.retry import RetryPolicy, is_transient

__all__ = [
    "FsspecStore", "LocalStore", "MemoryStore", "ObjectInfo", "RetryPolicy", "S3Store", "Store",
    "is_transient", "open_store", "url_scheme", "validate_key",
]


def url_scheme(url: str) -> str:
    """The scheme of ``url``; a plain path is ``file``."""
    return url.split("://", 1)[0] if "://" in url else "file"


def open_store(url: str, *, pm: PluginManager | None = None, **options: Any) -> Store:
    """Open the store at ``url`` with the backend registered for its scheme.

    ``options`` are passed to the backend factory (e.g. ``endpoint_url`` for S3). Raises
    :class:`~relayrl.core.errors.StoreError` naming the URL when no backend handles the scheme.
    """
    scheme = url_scheme(url)
    from relayrl.core.hookspecs import STORES

    backends = STORES.registrations(pm)
    if scheme in backends:
        return backends[scheme].factory(url, **options)
    if scheme in fsspec.available_protocols():
        return FsspecStore.from_url(url, **options)
    known = ", ".join(sorted(backends))
    raise StoreError(f"store {url!r}: no backend for scheme {scheme!r} (registered: {known}; "
                     f"fsspec knows none either; is a plugin missing?)")
