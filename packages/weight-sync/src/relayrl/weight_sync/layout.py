"""Where weight versions live in a store, and reading/writing their manifests and ``latest`` pointer.

Keys under the prefix (``weights`` by default)::

    manifests/0000000012                      the committed manifest of version 12 (written last, if absent)
    shards/0000000012/g7/00001-of-00004       shard manifests of a sharded publish (one per trainer rank;
                                              g7: the publishers' generation, their first version)
    objects/0000000012/<attempt>-r00001-0000  packed tensor payloads of one publishing attempt
    bridges/0000000012-<attempt>              for a snapshot version: a delta from version 11 (the
                                              snapshot's manifest names it in ``metadata["bridge"]``)
    latest                                    the newest committed version, as decimal text (a hint)
    repair/0000000012-<reporter>              a follower could not build version 12 (an object or manifest
                                              failed verification): the next publish is a full snapshot

A version exists exactly when ``manifests/<version>`` exists; everything a manifest references was
written before it. ``latest`` only ever names a committed version but may lag behind (a publisher
killed between the manifest and the pointer), so readers probe forward from it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from typing import Any

from relayrl.core import codec
from relayrl.core.errors import ChecksumMismatch, ObjectExists, ObjectNotFound
from relayrl.core.store import Store
from relayrl.core.wire import WeightManifest
from relayrl.weight_sync.errors import CorruptManifest, WeightSyncError

_WIDTH = 10
CACHED_MANIFESTS = 128
"""Manifests (and bridges) a bus keeps decoded, least recently used first out: a replay chain is at
most ``snapshot_every_versions`` long, and a long-lived controller must not keep every version it
ever saw (a manifest of a model with a few hundred tensors is ~170 KB)."""


class WeightBus:
    """Weight versions in ``store`` under ``prefix``: key layout plus manifest and pointer I/O."""

    def __init__(self, store: Store, prefix: str = "weights") -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self._manifests: collections.OrderedDict[int, WeightManifest] = collections.OrderedDict()
        self._bridges: collections.OrderedDict[str, WeightManifest] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"WeightBus({self.store.url!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ keys
    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def manifest_key(self, version: int) -> str:
        return self.key(f"manifests/{version:0{_WIDTH}d}")

    def shard_prefix(self, version: int, generation: int) -> str:
        return self.key(f"shards/{version:0{_WIDTH}d}/g{generation}/")

    def shard_key(self, version: int, generation: int, rank: int, world_size: int) -> str:
        return self.shard_prefix(version, generation) + f"{rank:05d}-of-{world_size:05d}"

    def object_key(self, version: int, attempt: str, rank: int, part: int) -> str:
        return self.key(f"objects/{version:0{_WIDTH}d}/{attempt}-r{rank:05d}-{part:04d}")

    def bridge_key(self, version: int, attempt: str) -> str:
        return self.key(f"bridges/{version:0{_WIDTH}d}-{attempt}")

    def read_bridge(self, manifest: WeightManifest) -> WeightManifest | None:
        """The bridge delta a snapshot manifest names (onto the previous committed version), or None."""
        key = manifest.metadata.get("bridge")
        if not key:
            return None
        if key not in self._bridges:
            try:
                _remember(self._bridges, key, self.read_shard(key))
            except ObjectNotFound:
                return None
        self._bridges.move_to_end(key)
        return self._bridges[key]

    @staticmethod
    def version_of(key: str) -> int | None:
        """The version a manifest, shard or object key belongs to (None for other keys)."""
        parts = key.split("/")
        for index, part in enumerate(parts[:-1]):
            if part in ("manifests", "shards", "objects", "bridges") and index + 1 < len(parts):
                candidate = parts[index + 1].split("-", 1)[0]
                return int(candidate) if candidate.isdigit() else None
        return None

    # ------------------------------------------------------------------ manifests
    def committed_versions(self) -> list[int]:
        """Every committed version, ascending (one listing)."""
        versions = []
        for key in self.store.list(self.key("manifests/")):
            name = key.rsplit("/", 1)[-1]
            if name.isdigit():
                versions.append(int(name))
        return sorted(versions)

    def exists(self, version: int) -> bool:
        return self.store.exists(self.manifest_key(version))

    def read_manifest(self, version: int, *, cached: bool = True) -> WeightManifest:
        """The committed manifest of ``version``; ObjectNotFound when it is not (or no longer) there."""
        if cached and version in self._manifests:
            self._manifests.move_to_end(version)
            return self._manifests[version]
        key = self.manifest_key(version)
        manifest = checked(codec.decode(self.store.get(key), WeightManifest, what=f"{self.store.url}/{key}"),
                           version, what=f"{self.store.url}/{key}")
        _remember(self._manifests, version, manifest)
        return manifest

    def forget(self, version: int) -> None:
        """Drop a cached manifest (after it was deleted)."""
        self._manifests.pop(version, None)

    def write_manifest(self, manifest: WeightManifest, key: str | None = None) -> bool:
        """Commit ``manifest`` with a conditional create; False when that key already exists."""
        try:
            self.store.put(key or self.manifest_key(manifest.version), codec.encode(manifest), if_absent=True)
        except ObjectExists:
            return False
        if key is None:
            _remember(self._manifests, manifest.version, manifest)
        return True

    def read_shard(self, key: str) -> WeightManifest:
        """A shard manifest or a bridge delta, checked like a committed manifest (its key names its version)."""
        what = f"{self.store.url}/{key}"
        return checked(codec.decode(self.store.get(key), WeightManifest, what=what), self.version_of(key), what=what)

    # ------------------------------------------------------------------ repairs
    def request_repair(self, version: int, reporter: str, reason: str) -> None:
        """Ask the publisher for a fresh snapshot: ``version``'s route failed verification for ``reporter``."""
        record = {"version": version, "reporter": reporter, "reason": reason[:500], "time": time.time()}
        safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in reporter)[:64] or "follower"
        with contextlib.suppress(ObjectExists):  # already asked
            self.store.put(self.key(f"repair/{version:0{_WIDTH}d}-{safe}"), json.dumps(record).encode(),
                           if_absent=True)

    def repair_requests(self) -> list[str]:
        """Keys of the outstanding repair requests (one listing)."""
        return self.store.list(self.key("repair/"))

    # ------------------------------------------------------------------ latest
    def read_latest_pointer(self) -> int | None:
        """The version ``latest`` names; None when it is absent or unreadable (torn, failing its checksum,
        not a number). It is only a hint: readers then list the manifests, and the next publish
        rewrites it."""
        try:
            text = self.store.get(self.key("latest")).decode("ascii").strip()
        except (ObjectNotFound, ChecksumMismatch, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() else None

    def write_latest_pointer(self, version: int) -> None:
        """Point ``latest`` at committed ``version`` unless it already names a newer one."""
        if not self.exists(version):
            raise WeightSyncError(f"refusing to point latest at uncommitted version {version}")
        current = self.read_latest_pointer()
        if current is None or current < version or not self.exists(current):  # absent, damaged or dangling
            self.store.put(self.key("latest"), str(version).encode())

    def newest_version(self) -> int | None:
        """The newest committed version: the ``latest`` hint, then probes forward; a listing without a hint."""
        hint = self.read_latest_pointer()
        if hint is None or not self.exists(hint):
            versions = self.committed_versions()
            return versions[-1] if versions else None
        newest = hint
        while self.exists(newest + 1):
            newest += 1
        return newest


def checked(manifest: WeightManifest, version: int | None, *, what: str) -> WeightManifest:
    """``manifest`` if it can be true, else :class:`CorruptManifest`.

    It must hold the version its key names (``version``; None: not known from the key), and a delta's
    parent must be an older version. Every link of a parent chain then goes strictly down towards 0,
    so no walk down a chain (a route, retention's needs) can loop, however the store was written.
    """
    if version is not None and manifest.version != version:
        raise CorruptManifest(f"{what}: holds version {manifest.version}, not {version}")
    if manifest.version < 0:
        raise CorruptManifest(f"{what}: version {manifest.version} is negative")
    if manifest.kind == "delta" and (manifest.parent is None or not 0 <= manifest.parent < manifest.version):
        raise CorruptManifest(f"{what}: a delta of version {manifest.version} onto version {manifest.parent}: "
                              f"a parent must be an older version")
    return manifest


def _remember(cache: collections.OrderedDict, key: Any, value: WeightManifest) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHED_MANIFESTS:
        cache.popitem(last=False)


def new_manifest(**fields: object) -> WeightManifest:
    """A manifest with ``created_at`` set to now."""
    fields.setdefault("created_at", time.time())
    return WeightManifest(**fields)  # type: ignore[arg-type]
