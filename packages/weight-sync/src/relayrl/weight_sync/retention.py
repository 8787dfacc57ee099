"""Retention: delete old weight versions without ever breaking what a reader may still need.

Kept, always:

* the ``keep_versions`` newest committed versions, the version ``latest`` names, and any version
  passed in ``protect`` (e.g. what engines currently serve);
* every version on the delta chain of a kept version, back to and including its full snapshot
  (the bases a new engine needs to bootstrap);
* everything belonging to a version newer than the newest committed one: it is in flight.

Deleted: manifests of other committed versions first (so no new reader starts on them), then
objects, bridge deltas and shard manifests that no remaining manifest references, for versions up to the newest
committed one (objects of a dead publishing attempt included).
"""

from __future__ import annotations

from collections.abc import Iterable

from relayrl.core.errors import ChecksumMismatch, ObjectNotFound, WireError
from relayrl.weight_sync.layout import WeightBus


def needed_versions(bus: WeightBus, keep: Iterable[int]) -> set[int]:
    """``keep`` plus every version on their delta chains down to a full snapshot."""
    needed: set[int] = set()
    for version in keep:
        current: int | None = version
        while current is not None and current not in needed:
            try:
                manifest = bus.read_manifest(current)
            except (ObjectNotFound, ChecksumMismatch, WireError):
                break  # a broken or corrupt chain keeps what exists; readers fall back to a snapshot
            needed.add(current)
            current = manifest.parent if manifest.kind == "delta" else None
    return needed


def apply_retention(bus: WeightBus, *, keep_versions: int, protect: Iterable[int] = ()) -> list[int]:
    """Delete what retention allows (see the module docstring); return the versions deleted."""
    if keep_versions < 1:
        raise ValueError("keep_versions must be at least 1")
    committed = bus.committed_versions()
    if not committed:
        return []
    newest = committed[-1]
    keep = set(committed[-keep_versions:]) | set(protect)
    pointer = bus.read_latest_pointer()
    if pointer is not None:
        keep.add(pointer)
    needed = needed_versions(bus, keep)
    deleted = [version for version in committed if version not in needed]
    for version in deleted:
        bus.store.delete(bus.manifest_key(version))
        bus.forget(version)
    referenced: set[str] = set()
    for version in needed:
        manifest = bus.read_manifest(version)
        bridge = bus.read_bridge(manifest)
        for kept in (manifest, bridge) if bridge is not None else (manifest,):
            referenced.update(entry.object_key for entry in kept.tensors)
        if bridge is not None:
            referenced.add(manifest.metadata["bridge"])
    for prefix in ("objects/", "shards/", "bridges/"):
        for key in bus.store.list(bus.key(prefix)):
            version = bus.version_of(key)
            if version is None or version > newest or key in referenced:
                continue  # in flight, or still needed
            if prefix == "shards/" and version in needed:
                continue
            bus.store.delete(key)  # missing is fine: another cleaner got there first
    return deleted
