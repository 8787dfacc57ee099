"""Per-node staging: one controller per node copies each version once to local disk or shared memory.

``NodeMirror`` copies committed versions from the remote store (the bus across clusters) into a
node-local store (``file:///dev/shm/<run>`` or a local SSD), in the same layout and with the same
rule: objects first, manifest last with a conditional create, then ``latest``. Every engine on the
node runs its own :class:`~relayrl.weight_sync.Controller` against the local store, so a version
crosses the network once per node instead of once per engine, and engines decode from local memory.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from relayrl.core.store import Store, open_store
from relayrl.weight_sync.config import WeightSyncSection
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.layout import WeightBus
from relayrl.weight_sync.retention import apply_retention, needed_versions

log = logging.getLogger(__name__)


@dataclasses.dataclass
class MirrorReport:
    """What one :meth:`NodeMirror.sync_once` copied."""

    version: int | None
    versions_copied: list[int]
    bytes_copied: int
    seconds: float


class NodeMirror:
    """Mirrors the weight versions engines need from ``remote`` into node-local ``local``."""

    def __init__(self, remote: Store, local: Store, *, prefix: str = "weights", keep_versions: int = 2,
                 threads: int = 4) -> None:
        self.remote = WeightBus(remote, prefix)
        self.local = WeightBus(local, prefix)
        self.keep_versions = keep_versions
        self._threads = ThreadPoolExecutor(max(1, threads), thread_name_prefix="relayrl-weight-mirror")

    @classmethod
    def from_config(cls, remote: Store, section: WeightSyncSection) -> NodeMirror:
        """The mirror of a ``[weight_sync]`` section: ``remote`` into ``stage_url``."""
        if not section.stage_url:
            raise WeightSyncError("weight_sync.stage_url: empty; set it to a node-local URL such as file:///dev/shm/run")
        return cls(remote, open_store(section.stage_url), prefix=section.prefix, threads=section.upload_threads)

    def run(self, stop: threading.Event, poll_interval_s: float = 1.0) -> None:
        """Sync until ``stop`` is set; errors are logged and retried at the next poll."""
        while not stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:
                log.warning("mirroring weights failed (will retry): %s", exc)
            stop.wait(poll_interval_s)

    def sync_once(self) -> MirrorReport:
        """Copy the newest remote version and its chain (what is missing locally); prune old local ones."""
        start = time.perf_counter()
        target = self.remote.newest_version()
        if target is None:
            return MirrorReport(None, [], 0, time.perf_counter() - start)
        have = set(self.local.committed_versions())
        copied: list[int] = []
        total = 0
        for version in sorted(needed_versions(self.remote, [target])):
            if version in have:
                continue
            manifest = self.remote.read_manifest(version)
            bridge = self.remote.read_bridge(manifest)
            keys = sorted({entry.object_key for kept in (manifest, bridge) if kept is not None for entry in kept.tensors})
            total += sum(self._threads.map(self._copy_object, keys))
            if bridge is not None:
                self.local.write_manifest(bridge, key=manifest.metadata["bridge"])
            self.local.write_manifest(manifest)  # last, if absent: the local version is complete or absent
            copied.append(version)
        self.local.write_latest_pointer(target)
        apply_retention(self.local, keep_versions=self.keep_versions)
        return MirrorReport(target, copied, total, time.perf_counter() - start)

    def _copy_object(self, key: str) -> int:
        if self.local.store.exists(key):
            return 0
        data = self.remote.store.get_buffer(key)  # verified against its CRC trailer
        self.local.store.put(key, data)
        return len(data)

    def close(self) -> None:
        self._threads.shutdown(wait=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m relayrl.weight_sync.mirror REMOTE LOCAL``: one node's mirror, until SIGTERM or Ctrl-C."""
    import argparse
    import contextlib
    import json
    import signal

    parser = argparse.ArgumentParser(description="Mirror weight versions from the bus to node-local storage.")
    parser.add_argument("remote", help="the bus, e.g. s3://bucket/run")
    parser.add_argument("local", help="node-local store, e.g. file:///dev/shm/run")
    parser.add_argument("--remote-options", default="{}", metavar="JSON", help="store options of REMOTE")
    parser.add_argument("--prefix", default="weights")
    parser.add_argument("--keep-versions", type=int, default=2)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--once", action="store_true", help="copy the newest version once and exit")
    args = parser.parse_args(argv)
    mirror = NodeMirror(open_store(args.remote, **json.loads(args.remote_options)), open_store(args.local),
                        prefix=args.prefix, keep_versions=args.keep_versions)
    try:
        if args.once:
            report = mirror.sync_once()
            print(f"version {report.version}: copied {report.versions_copied} ({report.bytes_copied} bytes)")
            return 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            mirror.run(stop, args.poll_interval)
        return 0
    finally:
        mirror.close()


if __name__ == "__main__":
    raise SystemExit(main())
