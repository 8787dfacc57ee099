"""The object-store abstraction every relayrl component talks through.

A :class:`Store` is a flat namespace of immutable-ish objects addressed by ``/``-separated keys
under a root URL. It guarantees, for every backend:

* **Atomic visibility**: an object is either absent or complete; readers never see a partial one.
* **Checksums**: every object carries a trailer with its length and CRC-32 (see
  :mod:`relayrl.core.store.framing`); :meth:`Store.get` verifies it.
* **Conditional create**: ``put(..., if_absent=True)`` succeeds for exactly one writer.
* **List-after-write**: a completed ``put`` is visible to ``list`` and ``exists`` at once.
* **Retries**: transient errors are retried with backoff; permanent ones raise a
  :class:`~relayrl.core.errors.StoreError` naming the object.

Backends implement six primitives on full backend paths (``_write``, ``_read``, ``_size``,
``_list``, ``_delete``, ``_exists``); everything else lives here. The conformance suite
:class:`relayrl.core.testing.StoreTests` checks a backend against this contract.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import posixpath
from collections.abc import Callable, Sequence
from typing import TypeVar

from relayrl.core.errors import ChecksumMismatch, ObjectExists, ObjectNotFound, StoreError
from relayrl.core.store import framing
from relayrl.core.store.retry import RetryPolicy

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview

TEMP_MARKER = ".relayrl-tmp-"
"""Substring of the names of in-flight temporary objects; never a valid key, never listed."""


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object."""

    key: str
    size: int
    """Payload size in bytes (without the trailer)."""
    checksum: int
    """CRC-32 of the payload."""


def validate_key(key: str) -> str:
    """Return ``key`` if it is a clean relative ``/``-path, else raise StoreError naming it."""
    if not isinstance(key, str) or not key:
        raise StoreError(f"invalid object key {key!r}: must be a non-empty string")
    parts = key.split("/")
    if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StoreError(f"invalid object key {key!r}: must be a relative path without empty, '.' or '..' parts")
    if TEMP_MARKER in key:
        raise StoreError(f"invalid object key {key!r}: {TEMP_MARKER!r} is reserved for temporary objects")
    if "\x00" in key or "\\" in key:
        raise StoreError(f"invalid object key {key!r}: NUL and backslash are not allowed")
    return key


class Store(abc.ABC):
    """An object store rooted at ``url``. Subclasses implement the underscore primitives."""

    #: True when several processes can open the same URL and see the same objects.
    shared_across_processes: bool = True
    #: True when a writer killed mid-write can leave a temporary behind (a local file store), which
    #: :meth:`sweep_temporaries` removes; object stores write atomically and leave none.
    writes_temporaries: bool = False

    def __init__(self, url: str, root: str, *, retry: RetryPolicy | None = None) -> None:
        self.url = url.rstrip("/")
        self._root = root.rstrip("/")
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # ----------------------------------------------------------------------------- primitives
    @abc.abstractmethod
    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        """Atomically make ``path`` hold the concatenation of ``chunks``.

        With ``if_absent``, raise :class:`ObjectExists` (or FileExistsError) when ``path`` exists.
        """

    @abc.abstractmethod
    def _read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path``; FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def _size(self, path: str) -> int:
        """Size of ``path`` in bytes; FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def _list(self, directory: str) -> list[str]:
        """Full paths of all objects at any depth under ``directory`` (empty if none)."""

    @abc.abstractmethod
    def _delete(self, path: str) -> None:
        """Remove ``path``; FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def _exists(self, path: str) -> bool:
        """Whether ``path`` exists."""

    # ----------------------------------------------------------------------------- public API
    def child(self, prefix: str) -> Store:
        """A store of the same backend rooted at ``prefix`` under this one."""
        prefix = validate_key(prefix.strip("/"))
        other = copy.copy(self)
        other.url = f"{self.url}/{prefix}"
        other._root = f"{self._root}/{prefix}"
        return other

    def put(self, key: str, data: Buffer, *, if_absent: bool = False) -> ObjectInfo:
        """Write ``data`` under ``key`` atomically, with its checksum trailer.

        With ``if_absent=True`` the write succeeds only if no object ``key`` exists, else raises
        :class:`ObjectExists`; exactly one of several racing writers wins.
        """
        path = self._path(key)
        payload = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        trailer, crc = framing.make_trailer(payload)
        try:
            self._retrying(lambda: self._write(path, (payload, trailer), if_absent=if_absent))
        except (ObjectExists, FileExistsError) as exc:
            raise ObjectExists(f"object {self._describe(key)} already exists (conditional create)") from exc
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"writing object {self._describe(key)} failed: {_one_line(exc)}") from exc
        return ObjectInfo(key=key, size=len(payload), checksum=crc)

    def get_buffer(self, key: str) -> memoryview:
        """The verified payload of ``key`` as a zero-copy view; ObjectNotFound if absent."""
        blob = self._calling(key, lambda path: self._read(path))
        result = framing.unframe(blob)
        if isinstance(result, str):
            raise ChecksumMismatch(f"object {self._describe(key)}: {result}")
        return result[0]

    def get(self, key: str) -> bytes:
        """The verified payload of ``key`` as bytes; ObjectNotFound if absent."""
        return bytes(self.get_buffer(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Payload bytes ``[start, start + length)`` of ``key``, unverified.

        Callers that read ranges keep their own checksum of each range (weight manifests do).
        """
        if start < 0 or length < 0:
            raise StoreError(f"object {self._describe(key)}: invalid range start={start} length={length}")
        # One size request keeps ranges inside the payload (never into the trailer), without
        # reading the trailer itself.
        payload_size = self._calling(key, self._size) - framing.TRAILER_SIZE
        if start + length > payload_size:
            raise StoreError(f"object {self._describe(key)}: range [{start}, {start + length}) past its end "
                             f"({max(payload_size, 0)} bytes)")
        if length == 0:
            return b""
        return self._calling(key, lambda path: self._read(path, start, start + length))

    def stat(self, key: str) -> ObjectInfo:
        """Size and checksum of ``key`` from its trailer; ObjectNotFound if absent."""
        total = self._calling(key, self._size)
        trailer = self._calling(key, lambda path: self._read(path, max(0, total - framing.TRAILER_SIZE), total))
        parsed = framing.parse_trailer(trailer, total)
        if parsed is None:
            raise ChecksumMismatch(f"object {self._describe(key)}: no valid trailer (truncated, or not written by relayrl)")
        return ObjectInfo(key=key, size=parsed[0], checksum=parsed[1])

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (and is complete: partial objects are never visible)."""
        path = self._path(key)
        return self._retrying(lambda: self._exists(path))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with ``prefix`` (a plain string prefix, not only a directory)."""
        if prefix and not prefix.endswith("/"):
            validate_key(prefix)
        directory = posixpath.dirname(prefix.rstrip("/")) if not prefix.endswith("/") else prefix.rstrip("/")
        base = f"{self._root}/{directory}" if directory else self._root
        try:
            paths = self._retrying(lambda: self._list(base))
        except Exception as exc:
            raise StoreError(f"listing {self.url}/{prefix} failed: {_one_line(exc)}") from exc
        root = self._root + "/"
        keys = []
        for path in paths:
            path = path.rstrip("/")
            if not path.startswith(root) or TEMP_MARKER in path:
                continue
            key = path[len(root):]
            if key.startswith(prefix):
                keys.append(key)
        return sorted(keys)

    def delete(self, key: str, *, missing_ok: bool = True) -> None:
        """Remove ``key``. A missing object is fine unless ``missing_ok=False``."""
        try:
            self._calling(key, self._delete, action="deleting")
        except ObjectNotFound:
            if not missing_ok:
                raise

    def sweep_temporaries(self, older_than_s: float = 3600.0, prefix: str = "") -> int:
        """Delete temporaries left by writers that died mid-write (under ``prefix``) and older than
        ``older_than_s``; returns how many. Nothing to do unless :attr:`writes_temporaries`."""
        return 0

    # ----------------------------------------------------------------------------- helpers
    def _path(self, key: str) -> str:
        return f"{self._root}/{validate_key(key)}"

    def _describe(self, key: str) -> str:
        return f"{self.url}/{key}"

    def _retrying(self, operation: Callable[[], T]) -> T:
        return self.retry.call(operation)

    def _calling(self, key: str, operation: Callable[[str], T], *, action: str = "reading") -> T:
        """Run ``operation(path)`` with retries; map errors to StoreErrors naming the object."""
        path = self._path(key)
        try:
            return self._retrying(lambda: operation(path))
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"object {self._describe(key)} does not exist") from exc
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"{action} object {self._describe(key)} failed: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
