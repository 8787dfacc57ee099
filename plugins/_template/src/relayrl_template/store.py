"""An object-store backend that keeps objects in a dict: the six primitives, nothing else.

relayrl's :class:`~relayrl.core.store.Store` base class adds checksums, key validation, retries
and error messages; a backend only says how to write atomically, read, size, list, delete and
test existence of full paths.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from relayrl.core.errors import ObjectExists
from relayrl.core.store import Store

_OBJECTS: dict[str, bytes] = {}
_LOCK = threading.Lock()


class DictStore(Store):
    """Objects in a process-wide dict; writes are atomic because one assignment publishes them."""

    shared_across_processes = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DictStore:
        """Factory registered for the scheme: ``relayrl-template://some/prefix``."""
        return cls(url, root=url.split("://", 1)[1], **options)

    def _write(self, path: str, chunks: Sequence[bytes | memoryview], *, if_absent: bool) -> None:
        data = b"".join(chunks)  # build the whole object first, then publish it in one step
        with _LOCK:
            if if_absent and path in _OBJECTS:
                raise ObjectExists(path)
            _OBJECTS[path] = data

    def _read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        try:
            data = _OBJECTS[path]
        except KeyError:
            raise FileNotFoundError(path) from None
        return data[start:end]

    def _size(self, path: str) -> int:
        return len(self._read(path))

    def _list(self, directory: str) -> list[str]:
        prefix = directory.rstrip("/") + "/"
        with _LOCK:
            return [path for path in _OBJECTS if path.startswith(prefix)]

    def _delete(self, path: str) -> None:
        with _LOCK:
            if _OBJECTS.pop(path, None) is None:
                raise FileNotFoundError(path)

    def _exists(self, path: str) -> bool:
        return path in _OBJECTS
