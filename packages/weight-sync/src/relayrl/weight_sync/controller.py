"""The engine side: poll for versions, prefetch and verify while serving, then pause, apply, resume.

For a target version T the controller plans a route:

``delta``     T is one delta onto exactly the version the engine serves;
``replay``    several deltas onto the served version, crossing snapshots through their bridge deltas;
``snapshot``  the newest full snapshot at or below T, then every delta after it (a new engine, an
              engine whose version is not an ancestor of T, or when that is fewer bytes than replay).

It fetches every object of the route (verified by the store's CRC), decodes into CPU staging
buffers (the engine's current bits as the first base, read while it keeps serving), and checks the
checksum of the resulting bits of every tensor of the target version (a wrong base or a corrupt
delta anywhere on the route shows there; intermediate versions are not hashed, so replaying sparse
deltas in place touches only the changed elements). Only then does it
pause the engine, apply (copy or XOR in place), verify the engine's bits again, set the served
version and resume. Any failure before the pause leaves the engine untouched and retries by the
snapshot route; a mismatch after the apply re-applies the verified staged bits. An apply that
raises partway, or bits that still differ, leave the engine paused with its version unknown: it never
serves a mix of two versions under the old one's number, and the next update rewrites every tensor
from a snapshot, then resumes it (:attr:`Controller.held_paused`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from relayrl.core.errors import ChecksumMismatch, ObjectNotFound, StoreError, WireError
from relayrl.core.plugins import PluginManager
from relayrl.core.store import Store, open_store
from relayrl.core.wire import WeightManifest
from relayrl.weight_sync import bits as tensor_bits
from relayrl.weight_sync.checksum import tensor_checksum
from relayrl.weight_sync.codecs import Codec, DecodeItem, make_codec
from relayrl.weight_sync.config import WeightSyncSection
from relayrl.weight_sync.engine import EngineAdapter
from relayrl.weight_sync.errors import BitMismatch, VersionUnavailable, WeightSyncError
from relayrl.weight_sync.layout import WeightBus
from relayrl.weight_sync.parallel import ChunkPool

log = logging.getLogger(__name__)
Route = Literal["delta", "replay", "snapshot"]


@dataclasses.dataclass
class Plan:
    """The manifests to apply, oldest first, and where the first one's base comes from."""

    target: int
    route: Route
    manifests: list[WeightManifest]
    fetch_bytes: int


@dataclasses.dataclass
class ApplyReport:
    """One update of one engine, with every phase timed in seconds."""

    version: int
    previous: int | None
    route: Route
    versions_decoded: int
    bytes_fetched: int
    fetch_s: float
    decode_s: float
    """Decoding and checking the resulting bits of every version of the route (engine serving)."""
    pause_s: float
    """From asking the engine to pause until it resumed."""
    apply_s: float
    verify_after_apply_s: float
    total_s: float
    retried: bool = False


def plan_route(bus: WeightBus, target: int, served: int | None) -> Plan:
    """The cheapest route from ``served`` to ``target`` (see the module docstring)."""
    snapshot_route = _snapshot_chain(bus, target)
    limit = _fetch_bytes(snapshot_route) if snapshot_route is not None else None
    replay = _replay_chain(bus, target, served, limit) if served is not None and served < target else None
    if replay is not None:
        return Plan(target, "delta" if len(replay) == 1 else "replay", replay, _fetch_bytes(replay))
    if snapshot_route is None:
        raise VersionUnavailable(f"version {target}: neither its snapshot chain nor a replay from version {served} "
                                 f"is complete (deleted by retention, or never committed)")
    return Plan(target, "snapshot", snapshot_route, _fetch_bytes(snapshot_route))


UNREADABLE = (ObjectNotFound, ChecksumMismatch, WireError)
"""A manifest or bridge that is gone, fails its checksum or does not decode: its route is unavailable,
and the planner takes another (a replay's corrupt link sends it to the snapshot)."""


def _snapshot_chain(bus: WeightBus, target: int) -> list[WeightManifest] | None:
    """The newest full snapshot at or below ``target`` and the deltas after it, oldest first."""
    chain: list[WeightManifest] = []
    current: int | None = target
    while current is not None:
        try:
            manifest = bus.read_manifest(current)
        except UNREADABLE:
            return None
        chain.append(manifest)
        if manifest.kind == "full":
            return chain[::-1]
        current = manifest.parent
    return None


def _replay_chain(bus: WeightBus, target: int, served: int, limit: int | None) -> list[WeightManifest] | None:
    """Deltas from exactly ``served`` to ``target`` (bridges across snapshots), if no more than ``limit`` bytes."""
    steps: list[WeightManifest] = []
    size = 0
    current = target
    while current > served:
        try:
            manifest = bus.read_manifest(current)
            bridge = bus.read_bridge(manifest) if manifest.kind == "full" else None
        except UNREADABLE:
            return None
        if manifest.kind == "full":
            if bridge is None:
                return None
            manifest = bridge
        size += _fetch_bytes([manifest])
        if limit is not None and size > limit:
            return None  # the snapshot is fewer bytes: jump to it
        steps.append(manifest)
        current = manifest.parent if manifest.parent is not None else -1
    return steps[::-1] if current == served and steps else None


def _fetch_bytes(manifests: Iterable[WeightManifest]) -> int:
    return sum(entry.length for manifest in manifests for entry in manifest.tensors)


class Controller:
    """Keeps one engine at the newest committed version of ``store`` (see the module docstring).

    Example::

        controller = Controller(open_store("s3://bucket/run"), StateDictAdapter(model))
        stop = threading.Event()
        threading.Thread(target=controller.run, args=(stop,), daemon=True).start()
    """

    def __init__(self, store: Store, engine: EngineAdapter, *, prefix: str = "weights", threads: int = 0,
                 download_threads: int = 4, apply_mode: Literal["copy", "xor"] = "copy",
                 verify_after_apply: bool = True, reset_caches_on_apply: bool = False,
                 poll_interval_s: float = 1.0, reporter: str = "", pm: PluginManager | None = None) -> None:
        if apply_mode not in ("copy", "xor"):
            raise WeightSyncError(f"apply_mode must be 'copy' or 'xor', got {apply_mode!r}")
        self.bus = WeightBus(store, prefix)
        self.source = getattr(store, "url", "") or type(store).__name__
        """Where versions are read from (the bus, or a node mirror): for :meth:`settings`."""
        self.engine = engine
        self.apply_mode = apply_mode
        self.verify_after_apply = verify_after_apply
        self.reset_caches_on_apply = reset_caches_on_apply
        self.poll_interval_s = poll_interval_s
        self.pool = ChunkPool(threads)
        self._downloads = ThreadPoolExecutor(max(1, download_threads), thread_name_prefix="relayrl-weight-fetch")
        self._pm = pm
        self._codecs: dict[str, Codec] = {}
        self._staging: dict[str, np.ndarray] = {}
        self.reports: collections.deque[ApplyReport] = collections.deque(maxlen=256)
        """The most recent updates' reports, oldest first."""
        self.reporter = reporter or f"{socket.gethostname()}-{os.getpid()}"
        """Who this follower is in the repair requests it files."""
        self.broken: int | None = None
        """A version no route to which verified; polls skip it until a newer version (the repair) appears."""
        self.held_paused = False
        """True while an apply that failed partway left the engine paused: its bits are a mix of two
        versions, so it serves nothing until an update (then from a snapshot) succeeds."""

    @classmethod
    def from_config(cls, store: Store, engine: EngineAdapter, section: WeightSyncSection, **overrides: Any) -> Controller:
        """A controller configured by a ``[weight_sync]`` section; ``overrides`` win.

        With ``stage_url`` set, the controller reads the node-local mirror that this node's
        :class:`~relayrl.weight_sync.NodeMirror` fills, instead of ``store``.
        """
        if section.stage_url:
            store = open_store(section.stage_url)
        options: dict[str, Any] = dict(prefix=section.prefix, threads=section.threads,
                                       download_threads=section.upload_threads, apply_mode=section.apply_mode,
                                       verify_after_apply=section.verify_after_apply,
                                       reset_caches_on_apply=section.reset_caches_on_apply,
                                       poll_interval_s=section.poll_interval_s)
        options.update(overrides)
        return cls(store, engine, **options)

    def settings(self) -> dict[str, Any]:
        """How this controller applies versions (what an engine's health reports)."""
        return {"source": self.source, "prefix": self.bus.prefix, "apply_mode": self.apply_mode,
                "verify_after_apply": self.verify_after_apply, "reset_caches_on_apply": self.reset_caches_on_apply,
                "poll_interval_s": self.poll_interval_s}

    # ------------------------------------------------------------------ loop
    def poll_once(self) -> ApplyReport | None:
        """Update the engine to the newest committed version, if it is not there; the report or None."""
        target = self.bus.newest_version()
        if target is None or target == self.engine.served_version or target == self.broken:
            return None
        return self.update_to(target)

    def run(self, stop: threading.Event, poll_interval_s: float | None = None) -> None:
        """Poll until ``stop`` is set; errors are logged and retried at the next poll."""
        interval = self.poll_interval_s if poll_interval_s is None else poll_interval_s
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:
                log.warning("weight update failed (will retry): %s", exc)
            stop.wait(interval)

    def close(self) -> None:
        self._downloads.shutdown(wait=True)
        self.pool.close()

    # ------------------------------------------------------------------ one update
    def update_to(self, target: int) -> ApplyReport:
        """Bring the engine to ``target``: prefetch, verify, pause, apply, resume. Retries once by snapshot."""
        started = time.perf_counter()
        previous = self.engine.served_version
        try:
            plan = plan_route(self.bus, target, previous)
            staged = self._prefetch(plan)
            retried = False
        except (StoreError, WireError, WeightSyncError) as exc:  # a bad or vanished object, a wrong base, a broken chain
            # On any doubt: newest snapshot plus replay, ignoring what the engine holds.
            log.warning("update to version %d by its %s route failed (%s); retrying from a snapshot", target,
                        "planned", exc)
            try:
                plan = plan_route(self.bus, target, None)
                staged = self._prefetch(plan)
            except (StoreError, WireError, WeightSyncError) as again:
                # No route verifies (a corrupt object or manifest on the snapshot chain): ask the
                # publisher for a fresh snapshot, and stop refetching this version until one appears.
                self.broken = target
                with contextlib.suppress(Exception):
                    self.bus.request_repair(target, self.reporter, f"{type(again).__name__}: {again}")
                raise VersionUnavailable(f"version {target}: no route verifies ({again}); asked the publisher "
                                         f"for a fresh snapshot") from again
            retried = True
        fetch_s, decode_s = staged
        pause_s, apply_s, verify_s = self._apply(plan)
        report = ApplyReport(version=target, previous=previous, route=plan.route,
                             versions_decoded=len(plan.manifests), bytes_fetched=plan.fetch_bytes, fetch_s=fetch_s,
                             decode_s=decode_s, pause_s=pause_s, apply_s=apply_s, verify_after_apply_s=verify_s,
                             total_s=time.perf_counter() - started, retried=retried)
        self.reports.append(report)
        self.broken = None
        return report

    def _prefetch(self, plan: Plan) -> tuple[float, float]:
        """Fetch and decode the route into the staging buffers, checking every version's bits."""
        start = time.perf_counter()
        keys = sorted({entry.object_key for manifest in plan.manifests for entry in manifest.tensors})
        blobs = dict(zip(keys, self._downloads.map(self.bus.store.get_buffer, keys)))
        fetch_s = time.perf_counter() - start
        start = time.perf_counter()
        specs = self.engine.tensor_specs()
        last = len(plan.manifests) - 1
        for step, manifest in enumerate(plan.manifests):
            self._decode_version(manifest, blobs, specs, first=step == 0, from_engine=plan.route != "snapshot",
                                 verify=step == last)
        return fetch_s, time.perf_counter() - start

    def _decode_version(self, manifest: WeightManifest, blobs: dict[str, memoryview],
                        specs: dict[str, tuple[str, list[int]]], *, first: bool, from_engine: bool,
                        verify: bool) -> None:
        names = {entry.name for entry in manifest.tensors}
        if names != set(specs):
            missing, extra = sorted(set(specs) - names), sorted(names - set(specs))
            raise WeightSyncError(f"version {manifest.version} does not match the engine's tensors "
                                  f"(engine only: {missing[:5]}, version only: {extra[:5]})")
        by_codec: dict[str, list[tuple[Any, DecodeItem]]] = {}
        for entry in manifest.tensors:
            dtype, shape = specs[entry.name]
            if entry.dtype != dtype or list(entry.shape) != list(shape):
                raise WeightSyncError(f"version {manifest.version}: tensor {entry.name} is {entry.dtype}{entry.shape}, "
                                      f"the engine's is {dtype}{shape}")
            codec = self._codec(entry.codec)
            out = self._staging_buffer(entry.name, int(np.prod(shape, dtype=np.int64)) * tensor_bits.element_bytes(dtype))
            base = None
            if codec.is_delta:
                base = self.engine.read_bits(entry.name) if first and from_engine else out
            payload = blobs[entry.object_key][entry.offset:entry.offset + entry.length]
            if len(payload) != entry.length:
                raise WeightSyncError(f"version {manifest.version}: tensor {entry.name} lies past the end of "
                                      f"{entry.object_key}")
            item = DecodeItem(payload=payload, base=base, out=out, element_bytes=tensor_bits.element_bytes(dtype),
                              name=f"version {manifest.version} tensor {entry.name}", checksum=verify)
            by_codec.setdefault(entry.codec, []).append((entry, item))
        for codec_name, pairs in by_codec.items():
            checksums = self._codec(codec_name).decode_many([item for _, item in pairs], self.pool)
            for (entry, _), checksum in zip(pairs, checksums):
                if verify and checksum != entry.checksum:
                    raise BitMismatch(f"version {manifest.version}: tensor {entry.name} decoded to bits with checksum "
                                      f"{checksum}, the manifest says {entry.checksum} (wrong base or corrupt data)")

    def _apply(self, plan: Plan) -> tuple[float, float, float]:
        target = plan.manifests[-1]
        if self.apply_mode == "xor":
            # Turn the staged new bits into (new XOR current) while the engine still serves.
            for name, staged in self._staging.items():
                current = self.engine.read_bits(name)
                np.bitwise_xor(staged, current, out=staged)
        paused_at = time.perf_counter()
        if not self.held_paused:
            self.engine.pause()
        # From here until the new version is recorded the engine's bits are in flux: if anything
        # fails, it stays paused with an unknown version (never serving a mix of two versions
        # under the old one's number) and the next update rewrites every tensor from a snapshot.
        self.held_paused = True
        try:
            start = time.perf_counter()
            if self.apply_mode == "xor":
                self.engine.apply_xor(self._staging)
            else:
                self.engine.apply_tensors(self._staging)
            apply_s = time.perf_counter() - start
            start = time.perf_counter()
            if self.verify_after_apply and not self._engine_matches(target):
                if self.apply_mode == "copy":
                    self.engine.apply_tensors(self._staging)
                if self.apply_mode == "xor" or not self._engine_matches(target):
                    raise BitMismatch(f"engine bits differ from version {target.version} after applying it")
            verify_s = time.perf_counter() - start
            self.engine.set_served_version(target.version)
            if self.reset_caches_on_apply:
                self.engine.reset_caches()
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.engine.set_served_version(None)
            kind = type(exc) if isinstance(exc, WeightSyncError) else WeightSyncError  # BitMismatch stays one
            raise kind(f"applying version {target.version} failed ({type(exc).__name__}: {exc}); the engine stays "
                       f"paused with an unknown version until an update from a snapshot succeeds") from exc
        self.held_paused = False
        self.engine.resume()
        return time.perf_counter() - paused_at, apply_s, verify_s

    def _engine_matches(self, manifest: WeightManifest) -> bool:
        for entry in manifest.tensors:
            if tensor_checksum(self.engine.read_bits(entry.name), self.pool) != entry.checksum:
                log.error("engine tensor %s differs from version %d after apply", entry.name, manifest.version)
                return False
        return True

    def _codec(self, name: str) -> Codec:
        if name not in self._codecs:
            self._codecs[name] = make_codec(name, pm=self._pm)
        return self._codecs[name]

    def _staging_buffer(self, name: str, size: int) -> np.ndarray:
        buffer = self._staging.get(name)
        if buffer is None or buffer.size != size:
            buffer = self._staging[name] = np.empty(size, np.uint8)
        return buffer
