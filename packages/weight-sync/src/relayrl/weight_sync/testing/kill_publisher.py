"""Publisher processes for the SIGKILL fault test: each publishes versions until it is killed.

Run as ``python -m relayrl.weight_sync.testing.kill_publisher URL``: a *zygote* that imports
everything once, then for every ``go`` line on stdin forks a publisher process and prints its pid.
A test SIGKILLs that pid at a random moment; forking from a warm zygote costs milliseconds where a
fresh interpreter costs half a second of imports, which is what lets the test kill hundreds of
publishers in reasonable time. The zygote starts no threads before forking; each child opens the
store and starts its publisher's threads itself.

Each child publishes :func:`expected_state` of each version number with a real
:class:`~relayrl.weight_sync.Publisher` (background upload, snapshots with bridges, retention). The
bits of a version are a function of its number alone, so a checker knows what every committed
version must hold, whichever process published it.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from relayrl.weight_sync.testing.synthetic import model_state

SEED = 1234
SIZES = {"embed.weight": 96_000, "layers.0.mlp.weight": 640_000, "layers.0.norm.weight": 7}
SNAPSHOT_EVERY = 5
KEEP_VERSIONS = 2


def expected_state(version: int) -> dict[str, np.ndarray]:
    """The tensors version ``version`` holds."""
    return model_state(version, SEED, SIZES)


def publish_forever(url: str) -> None:
    """Publish version after version into ``url`` (never returns)."""
    from relayrl.core.store import open_store
    from relayrl.weight_sync import Publisher

    publisher = Publisher(open_store(url), snapshot_every_versions=SNAPSHOT_EVERY, keep_versions=KEEP_VERSIONS,
                          chunk_bytes=1 << 20, threads=2)
    while True:
        publisher.publish(expected_state(publisher.next_version)).result()


def zygote(url: str) -> None:
    import relayrl.core.store
    import relayrl.weight_sync  # noqa: F401

    if url.startswith("s3://"):
        import s3fs  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                publish_forever(url)
            finally:
                os._exit(1)
        print(pid, flush=True)


if __name__ == "__main__":
    zygote(sys.argv[1])
