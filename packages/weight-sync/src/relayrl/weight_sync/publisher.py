"""The trainer side: publish a weight version every K steps, in the background.

``Publisher.publish`` copies the tensors' bits into reused CPU buffers (the only part the trainer
waits for) and hands the rest to a background thread: encode (a delta against the last published
bits, or a full snapshot every N versions), upload the objects, then commit the manifest with a
conditional create, move ``latest``, and run retention. A version is therefore visible only when
complete, and a publisher killed at any point leaves the last committed version intact.

Sharded publishing: with ``world_size > 1`` each trainer rank publishes the tensors it owns under
the same version numbers; a rank writes a shard manifest, and the version's manifest (the union of
all shards) is committed by whichever rank finds every shard present. Ranks must agree on
``first_version`` (broadcast it from rank 0).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from relayrl.core.errors import ObjectNotFound
from relayrl.core.plugins import PluginManager
from relayrl.core.store import Store
from relayrl.core.wire import TensorEntry, WeightManifest
from relayrl.weight_sync import bits as tensor_bits
from relayrl.weight_sync.checksum import tensor_checksum
from relayrl.weight_sync.codecs import DEFAULT_DELTA_CODEC, DEFAULT_FULL_CODEC, Codec, Encoded, EncodeItem, make_codec
from relayrl.weight_sync.config import WeightSyncSection
from relayrl.weight_sync.errors import ConcurrentWriter, WeightSyncError
from relayrl.weight_sync.layout import WeightBus, new_manifest
from relayrl.weight_sync.parallel import ChunkPool
from relayrl.weight_sync.retention import apply_retention

MIB = 1 << 20
log = logging.getLogger(__name__)


TEMPORARY_AGE_S = 3600.0
"""A temporary file this old under the weight prefix belongs to a writer that died: retention sweeps it."""


class _EarlierAttemptCommitted(Exception):
    """This publisher's earlier attempt at a version committed after all (its write had reported an error)."""


@dataclasses.dataclass
class PublishReport:
    """What one publish did, with the time of each phase in seconds."""

    version: int
    kind: str
    committed: bool
    """False for a shard whose version still waits for other ranks."""
    model_bytes: int
    stored_bytes: int
    copy_s: float
    encode_s: float
    upload_s: float
    commit_s: float
    retention_s: float
    deleted_versions: list[int] = dataclasses.field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.model_bytes / max(1, self.stored_bytes)


@dataclasses.dataclass
class _TensorMeta:
    dtype: str
    shape: list[int]
    element_bytes: int


class Publisher:
    """Publishes weight versions of a trainer into ``store`` (see the module docstring).

    Example::

        publisher = Publisher(open_store("s3://bucket/run"), publish_every_steps=4)
        for step in range(steps):
            train_step()
            publisher.maybe_publish(step, model.state_dict())
        publisher.close()          # waits for the last upload
    """

    def __init__(self, store: Store, *, prefix: str = "weights", publish_every_steps: int = 1,
                 snapshot_every_versions: int = 50, delta_codec: str = DEFAULT_DELTA_CODEC, full_codec: str = DEFAULT_FULL_CODEC,
                 zstd_level: int = 1, chunk_bytes: int = 4 * MIB, min_gain: float = 0.01, threads: int = 0,
                 object_bytes: int = 256 * MIB, upload_threads: int = 4, keep_versions: int = 4,
                 keep_every: int = 0, rank: int = 0, world_size: int = 1, first_version: int | None = None,
                 bridge_deltas: bool = True, background: bool = True, publish_dtype: str | None = None,
                 pm: PluginManager | None = None) -> None:
        if publish_every_steps < 1 or snapshot_every_versions < 1:
            raise WeightSyncError("publish_every_steps and snapshot_every_versions must be at least 1")
        if not 0 <= rank < world_size:
            raise WeightSyncError(f"rank {rank} is outside world_size {world_size}")
        if world_size > 1 and first_version is None:
            raise WeightSyncError("sharded publishing needs first_version, agreed by every rank")
        self.bus = WeightBus(store, prefix)
        self.publish_every_steps = publish_every_steps
        self.snapshot_every_versions = snapshot_every_versions
        options = {"level": zstd_level, "chunk_bytes": chunk_bytes, "min_gain": min_gain}
        self.delta_codec: Codec = make_codec(delta_codec, pm=pm, **options)
        self.full_codec: Codec = make_codec(full_codec, pm=pm, **options)
        if not self.delta_codec.is_delta or self.full_codec.is_delta:
            raise WeightSyncError(f"delta_codec {delta_codec!r} must be a delta codec and full_codec "
                                  f"{full_codec!r} a full one")
        self.object_bytes = object_bytes
        self.bridge_deltas = bridge_deltas
        if publish_dtype is not None and publish_dtype not in tensor_bits.CASTABLE_DTYPES:
            raise WeightSyncError(f"publish_dtype {publish_dtype!r}: one of {', '.join(tensor_bits.CASTABLE_DTYPES)}")
        self.publish_dtype = publish_dtype
        """Floating tensors are published in this dtype (the engines' representation: low-precision
        rollouts), whatever the trainer's; None publishes them as they are."""
        self.keep_versions = keep_versions
        self.keep_every = keep_every
        self.rank, self.world_size = rank, world_size
        self.pool = ChunkPool(threads)
        self._uploads = ThreadPoolExecutor(max(1, upload_threads), thread_name_prefix="relayrl-weight-upload")
        self._background = ThreadPoolExecutor(1, thread_name_prefix="relayrl-weight-publish") if background else None
        self._pending: Future[PublishReport] | None = None
        self._lock = threading.Lock()
        committed = self.bus.committed_versions()
        # A restarted publisher reuses the number of a version that never committed (with a new
        # attempt id, so its objects never collide); versions therefore stay contiguous.
        self.next_version = first_version if first_version is not None else (committed[-1] + 1 if committed else 1)
        self.generation = self.next_version
        self.failed_version: int | None = None
        """The version the newest publish failed to commit (None once one commits): :meth:`behind`."""
        self._base: dict[str, np.ndarray] | None = None      # bits of the last committed version
        self._spare: dict[str, np.ndarray] = {}              # reused buffers for the next copy
        self._meta: dict[str, _TensorMeta] = {}
        self._base_version: int | None = None
        self._snapshot_version: int | None = None
        self.last_report: PublishReport | None = None
        self.last_error: BaseException | None = None
        self._attempts: collections.deque[str] = collections.deque(maxlen=64)
        """This publisher's recent attempt ids: a manifest carrying one is its own, not another writer's."""

    @classmethod
    def from_config(cls, store: Store, section: WeightSyncSection, **overrides: Any) -> Publisher:
        """A publisher configured by a ``[weight_sync]`` section; ``overrides`` win."""
        options: dict[str, Any] = dict(
            prefix=section.prefix, publish_every_steps=section.publish_every_steps,
            snapshot_every_versions=section.snapshot_every_versions, delta_codec=section.delta_codec,
            full_codec=section.full_codec, zstd_level=section.zstd_level, chunk_bytes=section.chunk_mib * MIB,
            min_gain=section.min_gain, threads=section.threads, object_bytes=section.object_mib * MIB,
            upload_threads=section.upload_threads, keep_versions=section.keep_versions,
            keep_every=section.keep_every)
        options.update(overrides)
        return cls(store, **options)

    def _milestones(self, newest: int) -> list[int]:
        """Versions retention keeps for later evaluation: 1, 1 + N, 1 + 2N, ... (``keep_every`` = N)."""
        return list(range(1, newest + 1, self.keep_every)) if self.keep_every > 0 else []

    # ------------------------------------------------------------------ public API
    def maybe_publish(self, step: int, tensors: Mapping[str, Any], **kwargs: Any) -> Future[PublishReport] | None:
        """Publish when ``step`` is a multiple of ``publish_every_steps``; else do nothing."""
        if step % self.publish_every_steps:
            return None
        return self.publish(tensors, step=step, **kwargs)

    def publish(self, tensors: Mapping[str, Any], *, step: int = 0, metadata: Mapping[str, str] | None = None,
                version: int | None = None) -> Future[PublishReport]:
        """Publish ``tensors`` (name -> numpy array or torch tensor, any device) as the next version.

        ``version`` numbers it explicitly (a trainer that publishes every K steps numbers versions by
        its own step count, so that token versions and trainer versions share one scale); it must
        not be below the next number. Unpublished numbers in between are simply skipped: a delta's
        ``parent`` is the last committed version, whatever its number (single-rank publishing; sharded
        publishing keeps versions contiguous).

        Returns once the bits are copied to CPU; the returned future completes when the version is
        committed (or fails). A previous publish still uploading is waited for first (backpressure:
        at most one version in flight). A failed publish is logged and kept in ``last_error``; its
        version number is reused by the next publish, still as a delta against the last committed
        version, so a transient store outage costs one interval, not a snapshot.
        """
        with self._lock:
            try:
                self.wait()
            except ConcurrentWriter:  # another trainer writes this bus: publishing on would only fail again
                raise
            except Exception as exc:
                self.last_error = exc
                log.warning("publishing weight version %d failed: %s", self.next_version, exc)
            if version is None:
                version = self.next_version
            elif version < self.next_version or (self.world_size > 1 and version != self.next_version):
                raise WeightSyncError(f"cannot publish version {version}: the next version is {self.next_version}"
                                      + (" (sharded publishing needs contiguous versions)" if self.world_size > 1 else ""))
            start = time.perf_counter()
            current = self._copy_to_cpu(tensors)
            copy_s = time.perf_counter() - start
            self.next_version = version + 1
            job = (version, current, step, dict(metadata or {}), copy_s)
            if self._background is None:
                future: Future[PublishReport] = Future()
                try:
                    future.set_result(self._publish_version(*job))
                except BaseException as exc:
                    future.set_exception(exc)
                self._pending = future
            else:
                self._pending = self._background.submit(self._publish_version, *job)
            return self._pending

    def _repair_requests(self) -> list[str]:
        try:
            return self.bus.repair_requests()
        except Exception as exc:  # a failed listing must not fail the publish
            log.warning("listing repair requests failed: %s", exc)
            return []

    def behind(self) -> bool:
        """Whether the newest publish failed and nothing was committed since: the engines stay at the
        last committed version while the trainer moves on, so their groups grow stale. A trainer with
        nothing to train publishes again (:meth:`publish`) rather than wait for groups of weights the
        bus never got. False while a publish is in flight."""
        pending = self._pending
        return self.failed_version is not None and (pending is None or pending.done())

    def committed(self, version: int) -> bool:
        """Whether ``version`` is committed on the bus."""
        return self.bus.exists(version)

    def adopt(self, version: int, tensors: Mapping[str, Any]) -> bool:
        """Whether ``tensors`` are exactly the committed ``version`` (every tensor's checksum); then
        they become the base of the next delta, and nothing is published.

        A resumed deterministic trainer redoes the steps a crashed run took after its last checkpoint;
        their versions are on the bus already, with the same bits under the same numbers. False (and
        nothing changes) when the version is not committed or holds other bits.
        """
        with self._lock:
            self.wait()
            try:
                manifest = self.bus.read_manifest(version, cached=False)
            except ObjectNotFound:
                return False
            expected = {entry.name: entry.checksum for entry in manifest.tensors}
            if set(expected) != set(tensors):
                return False
            current = self._copy_to_cpu(tensors)
            if any(tensor_checksum(bits, self.pool) != expected[name] for name, bits in current.items()):
                self._spare = current
                return False
            if self._base_version is None or version > self._base_version:
                self._spare = self._base or {}
                self._base, self._base_version = current, version
                self._snapshot_version = version if manifest.kind == "full" else manifest.snapshot
            return True

    def repair_requested(self) -> bool:
        """Whether a follower asked for a fresh snapshot (a trainer with nothing to train republishes)."""
        return bool(self._repair_requests())

    def wait(self) -> PublishReport | None:
        """Wait for the publish in flight (if any) and return its report; re-raises its error."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        return pending.result()

    def close(self) -> None:
        """Wait for the last publish, then stop the threads."""
        try:
            self.wait()
        finally:
            if self._background is not None:
                self._background.shutdown(wait=True)
            self._uploads.shutdown(wait=True)
            self.pool.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ steps
    def _copy_to_cpu(self, tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
        meta = {}
        current: dict[str, np.ndarray] = {}
        for name, value in tensors.items():
            if self.publish_dtype is not None:
                value = tensor_bits.cast_floating(value, self.publish_dtype)
            dtype = tensor_bits.dtype_name(value)
            meta[name] = _TensorMeta(dtype, [int(size) for size in value.shape], tensor_bits.element_bytes(dtype))
            size = tensor_bits.nbytes(value)
            buffer = self._spare.get(name)
            if buffer is None or buffer.size != size:
                buffer = np.empty(size, np.uint8)
            tensor_bits.copy_bits_into(value, buffer, self.pool)
            current[name] = buffer
        if meta != self._meta:  # a changed tensor set or shape cannot be a delta
            self._base = None
            self._meta = meta
        return current

    def _publish_version(self, version: int, current: dict[str, np.ndarray], step: int,
                         metadata: dict[str, str], copy_s: float) -> PublishReport:
        try:
            try:
                return self._encode_upload_commit(version, current, step, metadata, copy_s)
            except _EarlierAttemptCommitted:
                # An earlier attempt at this version committed although its manifest write reported an
                # error: the version stands (complete and verifiable). Its bits are no longer here to
                # serve as a base, so these weights go out as the next version, a full snapshot.
                log.warning("weight version %d: an earlier attempt committed after its write reported an "
                            "error; keeping it, publishing these weights as version %d (a snapshot)",
                            version, version + 1)
                self._base, self._base_version, self._snapshot_version = None, None, None
                self.next_version = version + 2
                version += 1
                return self._encode_upload_commit(version, current, step, metadata, copy_s)
        except BaseException:
            # Nothing was committed: the next publish reuses this number (versions stay contiguous)
            # and these buffers; the base stays the last committed version.
            self.next_version = version
            self._spare = current
            self.failed_version = version
            raise
        finally:
            if self.next_version > version:  # committed (as this version, or the next after an earlier attempt)
                self.failed_version = None

    def _encode_upload_commit(self, version: int, current: dict[str, np.ndarray], step: int,
                              metadata: dict[str, str], copy_s: float) -> PublishReport:
        has_parent = self._base is not None and self._base_version is not None and (
            self._base_version == version - 1 if self.world_size > 1 else self._base_version < version)
        parent = self._base_version if has_parent else None
        # A follower that could not verify a version's route asked for a repair: a full snapshot
        # starts a fresh chain (single-rank publishing; sharded ranks must agree on the kind).
        repairs = self._repair_requests() if self.world_size == 1 else []
        full = (not has_parent or self._snapshot_version is None or bool(repairs)
                or version - self._snapshot_version >= self.snapshot_every_versions)
        # A snapshot with a parent also gets a bridge delta, so that engines a few versions behind
        # can replay across the snapshot instead of downloading it.
        bridge = full and has_parent and self.bridge_deltas and self.world_size == 1
        names = list(current)
        start = time.perf_counter()
        encoded = self._encode(current, names, delta=not full)
        bridge_encoded = self._encode(current, names, delta=True) if bridge else None
        encode_s = time.perf_counter() - start

        start = time.perf_counter()
        attempt = uuid.uuid4().hex[:12]
        self._attempts.append(attempt)
        codec = self.full_codec if full else self.delta_codec
        entries = self._upload(version, attempt, names, encoded, codec.name)
        metadata = {**metadata, "attempt": attempt, "world_size": str(self.world_size)}
        if bridge_encoded is not None:
            bridge_entries = self._upload(version, attempt + "-bridge", names, bridge_encoded, self.delta_codec.name)
            bridge_manifest = new_manifest(version=version, parent=parent, kind="delta", tensors=bridge_entries,
                                           snapshot=self._snapshot_version, step=step, metadata=dict(metadata))
            metadata["bridge"] = self.bus.bridge_key(version, attempt)
            self.bus.write_manifest(bridge_manifest, key=metadata["bridge"])
        upload_s = time.perf_counter() - start

        start = time.perf_counter()
        snapshot = version if full else self._snapshot_version
        manifest = new_manifest(version=version, parent=None if full else parent, kind="full" if full else "delta",
                                tensors=entries, snapshot=snapshot, step=step, metadata=metadata)
        committed = self._commit(manifest)
        commit_s = time.perf_counter() - start

        if committed and repairs:
            log.warning("weight version %d is a snapshot, answering %d repair request(s) (%s)", version,
                        len(repairs), ", ".join(key.rsplit("/", 1)[-1] for key in repairs[:3]))
            for key in repairs:
                self.bus.store.delete(key)
        # The new bits become the base of the next delta; the old base buffers are reused for the next copy.
        self._spare = self._base or {}
        self._base = current
        self._base_version = version
        self._snapshot_version = snapshot

        start = time.perf_counter()
        deleted: list[int] = []
        if committed and self.keep_versions > 0:
            try:
                deleted = apply_retention(self.bus, keep_versions=self.keep_versions, protect=self._milestones(version))
                # Files of writers killed mid-write (local stores), an hour old.
                self.bus.store.sweep_temporaries(older_than_s=TEMPORARY_AGE_S, prefix=self.bus.prefix)
            except Exception as exc:  # retention is housekeeping: the version is published
                log.warning("retention after version %d failed: %s", version, exc)
        report = PublishReport(version=version, kind=manifest.kind, committed=committed,
                               model_bytes=sum(array.size for array in current.values()),
                               stored_bytes=sum(entry.length for entry in entries), copy_s=copy_s,
                               encode_s=encode_s, upload_s=upload_s, commit_s=commit_s,
                               retention_s=time.perf_counter() - start, deleted_versions=deleted)
        self.last_report = report
        return report

    def _encode(self, current: dict[str, np.ndarray], names: list[str], *, delta: bool) -> list[Encoded]:
        codec = self.delta_codec if delta else self.full_codec
        items = [EncodeItem(current[name], self._base[name] if delta else None,  # type: ignore[index]
                            self._meta[name].element_bytes) for name in names]
        return codec.encode_many(items, self.pool)

    def _upload(self, version: int, attempt: str, names: list[str], encoded: list[Encoded],
                codec_name: str) -> list[TensorEntry]:
        """Pack payloads into objects of about ``object_bytes``, upload them in parallel, return entries."""
        groups: list[list[int]] = []
        size = 0
        for index, item in enumerate(encoded):
            length = len(memoryview(item.payload).cast("B"))
            if not groups or size + length > self.object_bytes:
                groups.append([])
                size = 0
            groups[-1].append(index)
            size += length
        entries: list[TensorEntry | None] = [None] * len(encoded)
        uploads = []
        for part, group in enumerate(groups):
            key = self.bus.object_key(version, attempt, self.rank, part)
            views = [memoryview(encoded[index].payload).cast("B") for index in group]
            # A single big payload is uploaded without a copy (raw snapshots of large tensors).
            data = views[0] if len(views) == 1 else b"".join(views)
            offset = 0
            for index, view in zip(group, views):
                meta = self._meta[names[index]]
                entries[index] = TensorEntry(name=names[index], dtype=meta.dtype, shape=meta.shape, object_key=key,
                                             offset=offset, length=len(view), codec=codec_name,
                                             checksum=encoded[index].checksum)
                offset += len(view)
            uploads.append(self._uploads.submit(self.bus.store.put, key, data))
        for upload in uploads:
            upload.result()
        return [entry for entry in entries if entry is not None]

    def _commit(self, manifest: WeightManifest) -> bool:
        """Write the manifest (or this rank's shard) last; True when the version is committed."""
        if self.world_size == 1:
            if not self.bus.write_manifest(manifest):
                existing = self.bus.read_manifest(manifest.version, cached=False)
                if existing.metadata.get("attempt") in self._attempts and \
                        existing.metadata.get("attempt") != manifest.metadata["attempt"]:
                    raise _EarlierAttemptCommitted(manifest.version)
                if existing.metadata.get("attempt") != manifest.metadata["attempt"]:
                    raise ConcurrentWriter(f"version {manifest.version} was committed by another publisher "
                                          f"(attempt {existing.metadata.get('attempt')}); is a second trainer writing "
                                          f"to {self.bus.store.url}/{self.bus.prefix}?")
            self._point_latest(manifest.version)
            return True
        shard_key = self.bus.shard_key(manifest.version, self.generation, self.rank, self.world_size)
        self.bus.write_manifest(manifest, key=shard_key)
        return self.try_commit_sharded(manifest.version)

    def try_commit_sharded(self, version: int) -> bool:
        """Commit sharded ``version`` if every rank's shard is present; True when it is committed."""
        if self.bus.exists(version):
            self._point_latest(version)
            return True
        keys = self.bus.store.list(self.bus.shard_prefix(version, self.generation))
        suffix = f"-of-{self.world_size:05d}"
        keys = [key for key in keys if key.endswith(suffix)]
        if len(keys) < self.world_size:
            return False
        shards = [self.bus.read_shard(key) for key in sorted(keys)]
        tensors = [entry for shard in shards for entry in shard.tensors]
        duplicated = {name for name, count in collections.Counter(entry.name for entry in tensors).items() if count > 1}
        if duplicated:
            raise WeightSyncError(f"version {version}: tensors published by more than one rank: {sorted(duplicated)[:5]}")
        full = all(shard.kind == "full" for shard in shards)
        snapshots = [shard.snapshot for shard in shards if shard.snapshot is not None]
        merged = new_manifest(version=version, parent=None if full else version - 1, kind="full" if full else "delta",
                              tensors=tensors, snapshot=min(snapshots) if snapshots else None,
                              step=max(shard.step for shard in shards),
                              metadata={"world_size": str(self.world_size),
                                        "attempt": ",".join(shard.metadata.get("attempt", "") for shard in shards)})
        self.bus.write_manifest(merged)  # False means another rank committed the same union first
        self._point_latest(version)
        return True

    def _point_latest(self, version: int) -> None:
        # The manifest is committed: a failure here must not un-publish it. Readers probe forward
        # from a stale pointer, and the next commit moves it.
        try:
            self.bus.write_latest_pointer(version)
        except Exception as exc:
            log.warning("version %d is committed but moving `latest` failed: %s", version, exc)
