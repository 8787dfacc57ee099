"""A publisher process for the SIGKILL fault test: publishes versions until it is killed.

Run as ``python -m relayrl.weight_sync.testing.kill_publisher URL SEED``. It imports everything,
prints ``ready``, waits for one line on stdin (so that a test can start the next process while it
checks the previous one), then publishes :func:`expected_state` of each version number with a real
:class:`~relayrl.weight_sync.Publisher` (background upload, snapshots, retention), printing each
committed version. The bits of any version are a function of the version alone, so a checker knows
what every committed version must hold whichever process published it.
"""

from __future__ import annotations

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


def main(url: str) -> None:
    from relayrl.core.store import open_store
    from relayrl.weight_sync import Publisher

    store = open_store(url)
    print("ready", flush=True)
    sys.stdin.readline()
    publisher = Publisher(store, snapshot_every_versions=SNAPSHOT_EVERY, keep_versions=KEEP_VERSIONS,
                          chunk_bytes=1 << 20, threads=2)
    while True:
        report = publisher.publish(expected_state(publisher.next_version)).result()
        print(report.version, report.kind, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
