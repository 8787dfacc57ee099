"""Built-in store backends over fsspec: local files, memory, S3, and any other fsspec protocol.

Atomicity comes from the medium:

* local files: write a hidden temporary file, ``fsync`` it, then ``rename`` (overwrite) or
  ``link`` (create-if-absent, which fails atomically when the target exists), then ``fsync`` the
  directory so the name survives a power cut;
* object stores (S3, GCS ...): a single PUT (or a completed multipart upload) is atomic by the
  protocol; create-if-absent uses the conditional ``If-None-Match: *`` header where the server
  supports it, otherwise put-then-verify (documented as weaker: two racing writers may both
  believe they won, but the object is never partial);
* memory: one process, so a lock around check-and-set.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import fsspec

from relayrl.core.config import Section
from relayrl.core.errors import ObjectExists, StoreError
from relayrl.core.store.base import TEMP_MARKER, Buffer, Store
from relayrl.core.store.retry import RetryPolicy


class FsspecStore(Store):
    """A store over any fsspec filesystem whose single-object writes are atomic (object stores)."""

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem, *, retry: RetryPolicy | None = None,
                 conditional_put: bool = True) -> None:
        root = fs._strip_protocol(url)
        super().__init__(url, root, retry=retry)
        self.fs = fs
        self.conditional_put = conditional_put
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        self.shared_across_processes = "memory" not in protocols

    @classmethod
    def from_url(cls, url: str, **options: Any) -> FsspecStore:
        """Open any fsspec URL; ``options`` go to the filesystem's constructor."""
        conditional_put = options.pop("conditional_put", True)
        retry = options.pop("retry", None)
        fs, _ = fsspec.core.url_to_fs(url, **options)
        return cls(url, fs, retry=retry, conditional_put=conditional_put)

    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        data = b"".join(chunks)
        if if_absent and self.conditional_put:
            self.fs.pipe_file(path, data, mode="create")
            return
        if if_absent and self._exists(path):
            raise ObjectExists(path)
        self.fs.pipe_file(path, data)
        if if_absent and self._size(path) != len(data):
            raise ObjectExists(path)  # someone else's object won the race

    def _read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.fs.cat_file(path, start=start, end=end)

    def _size(self, path: str) -> int:
        return int(self.fs.size(path))

    def _list(self, directory: str) -> list[str]:
        try:
            return list(self.fs.find(directory, withdirs=False))
        except FileNotFoundError:
            return []

    def _delete(self, path: str) -> None:
        if not self.fs.exists(path):
            raise FileNotFoundError(path)
        self.fs.rm_file(path)

    def _exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))


class S3Config(Section):
    """``[store.options]`` of an ``s3://`` bus: what :meth:`S3Store.from_url` takes from a config file.

    Credentials belong in the environment (``AWS_ACCESS_KEY_ID``, a profile, an instance role), not
    in a config file that is copied into every run directory; ``key``/``secret``/``token`` exist for
    servers that need them explicitly.
    """

    endpoint_url: str | None = None
    """The S3 endpoint (an S3-compatible server); None: ``AWS_ENDPOINT_URL``, else AWS's."""
    conditional_put: bool = True
    """Create-if-absent with ``If-None-Match: *``; false for servers without it (put-then-verify, weaker)."""
    anon: bool = False
    """Unsigned requests (a public bucket)."""
    profile: str | None = None
    """A named profile of the AWS config files."""
    key: str | None = None
    secret: str | None = None
    token: str | None = None
    requester_pays: bool = False
    client_kwargs: dict[str, Any] = {}
    """More arguments of the botocore client (``region_name``, ``verify``)."""
    config_kwargs: dict[str, Any] = {}
    """Arguments of ``botocore.config.Config`` (``retries``, ``max_pool_connections``)."""
    s3_additional_kwargs: dict[str, Any] = {}
    """Arguments added to every S3 request (``ServerSideEncryption``)."""


class S3Store(FsspecStore):
    """Amazon S3 and S3-compatible servers through s3fs.

    The endpoint comes from ``endpoint_url`` in ``options`` or from ``AWS_ENDPOINT_URL``; the region
    from ``AWS_DEFAULT_REGION`` (passing ``region_name`` breaks bucket creation on some servers).
    Listing caches are off: the bus needs list-after-write.
    """

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        try:
            import s3fs
        except ImportError as exc:
            raise StoreError(f"store {url}: the s3 backend needs s3fs (install relayrl-core with its s3 extra: pip install './packages/core[s3]' from a clone)") from exc
        conditional_put = options.pop("conditional_put", True)
        retry = options.pop("retry", None)
        endpoint = options.pop("endpoint_url", None) or os.environ.get("AWS_ENDPOINT_URL")
        client_kwargs = dict(options.pop("client_kwargs", {}))
        if endpoint:
            client_kwargs.setdefault("endpoint_url", endpoint)
        fs = s3fs.S3FileSystem(client_kwargs=client_kwargs, use_listings_cache=False,
                               skip_instance_cache=True, **options)
        return cls(url, fs, retry=retry, conditional_put=conditional_put)

    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        try:
            super()._write(path, chunks, if_absent=if_absent)
        except OSError as exc:
            message = str(exc)
            if if_absent and ("PreconditionFailed" in message or "precondition" in message.lower()):
                raise ObjectExists(path) from exc
            raise


class MemoryStore(FsspecStore):
    """fsspec's process-wide memory filesystem; for tests and single-process runs."""

    shared_across_processes = False
    _lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStore:
        retry = options.pop("retry", None)
        return cls(url, fsspec.filesystem("memory", **options), retry=retry)

    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        data = b"".join(chunks)
        with self._lock:
            if if_absent and self.fs.exists(path):
                raise ObjectExists(path)
            # MemoryFileSystem publishes the file in one assignment when the handle is closed.
            self.fs.pipe_file(path, data)


class LocalStoreConfig(Section):
    """``[store.options]`` of a directory bus (``file://``, a path, or the run directory itself)."""

    fsync: bool = True
    """fsync every object and its directory before it counts as written; false trades durability
    across a power cut for speed (a killed process still never leaves a partial object)."""


class LocalStore(Store):
    """A directory on a local (or shared POSIX) filesystem: temp file, fsync, rename/link."""

    writes_temporaries = True  # a writer killed between its temp file and the rename leaves the file

    def __init__(self, url: str, *, retry: RetryPolicy | None = None, fsync: bool = True) -> None:
        fs = fsspec.filesystem("file")
        super().__init__(url, fs._strip_protocol(url), retry=retry)
        self.fsync = fsync

    @classmethod
    def from_url(cls, url: str, *, fsync: bool = True, retry: RetryPolicy | None = None) -> LocalStore:
        """Open ``file:///abs/dir`` or a plain path. ``fsync=False`` trades durability for speed."""
        return cls(url if "://" in url else f"file://{os.path.abspath(url)}", retry=retry, fsync=fsync)

    def _write(self, path: str, chunks: Sequence[Buffer], *, if_absent: bool) -> None:
        directory, name = os.path.split(path)
        temp = os.path.join(directory, f".{name}{TEMP_MARKER}{uuid.uuid4().hex}")
        try:
            handle = _create_in(directory, temp)
            with handle:
                for chunk in chunks:
                    handle.write(chunk)
                handle.flush()
                if self.fsync:
                    os.fsync(handle.fileno())
            if if_absent:
                os.link(temp, path)  # atomic; FileExistsError when the name is taken
            else:
                os.replace(temp, path)
        finally:
            if os.path.lexists(temp):
                os.unlink(temp)
        if self.fsync:
            _fsync_directory(directory)

    def _read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        with open(path, "rb") as handle:
            if start is None:
                return handle.read()
            handle.seek(start)
            return handle.read((end if end is not None else os.path.getsize(path)) - start)

    def _size(self, path: str) -> int:
        return os.path.getsize(path)

    def _list(self, directory: str) -> list[str]:
        found = []
        for dirpath, _dirnames, filenames in os.walk(directory):
            found.extend(os.path.join(dirpath, name) for name in filenames)
        return found

    def _delete(self, path: str) -> None:
        os.unlink(path)
        # Prune the directories this left empty (one per weight version, per rollout producer...), up
        # to the store's root. A writer that loses its directory to this recreates it (_create_in);
        # a directory holding anything, even a writer's temporary file, is never removed.
        parent = os.path.dirname(path)
        root = os.path.normpath(self._root)
        while os.path.normpath(parent) != root and os.path.normpath(parent).startswith(root + os.sep):
            try:
                os.rmdir(parent)
            except OSError:  # not empty, or already gone
                break
            parent = os.path.dirname(parent)

    def _exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def sweep_temporaries(self, older_than_s: float = 3600.0, prefix: str = "") -> int:
        """Delete temporary files left by writers that died mid-write (under ``prefix``); returns how many."""
        import time

        cutoff = time.time() - older_than_s
        removed = 0
        for path in self._list(os.path.join(self._root, prefix) if prefix else self._root):
            if TEMP_MARKER in os.path.basename(path):
                try:
                    if os.path.getmtime(path) < cutoff:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    pass
        return removed


def _create_in(directory: str, path: str, attempts: int = 20) -> Any:
    """``open(path, "wb")``, creating ``directory`` first, again if a concurrent delete pruned it."""
    for attempt in range(attempts):
        try:
            # makedirs can lose a race with a prune too: a parent vanishing mid-way (FileNotFoundError),
            # or the directory pruned between its mkdir and its check (FileExistsError).
            os.makedirs(directory, exist_ok=True)
            return open(path, "wb")
        except (FileNotFoundError, FileExistsError):
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
