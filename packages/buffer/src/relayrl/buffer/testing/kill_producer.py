"""The rollout-manager stand-in of the kill tests: commits scored groups until killed, or done.

Run as ``python -m relayrl.buffer.testing.kill_producer STORE_URL PRODUCER_ID SEED SEGMENTS``.

Each life opens a :class:`SegmentWriter` under the same producer id (so it must resume the sequence
of its previous lives), generates groups at the policy version of the trainer's latest checkpoint
(as if it had just loaded the newest published weights) and prints ``committed KEY`` after each
segment commit. Like a rollout manager with a bounded off-policy lag, it commits at most
``SEGMENTS_PER_VERSION`` segments per trainer version, then waits for the trainer, but never more
than ``PACE_TIMEOUT_S`` (a trainer that needs more groups for a batch, because some were dropped,
must get them). It exits,
printing ``done``, once its producer has ``SEGMENTS`` segments.
"""

from __future__ import annotations

import random
import sys
import time
import uuid

from relayrl.buffer.segments import SegmentWriter
from relayrl.buffer.testing.groups import make_group
from relayrl.buffer.testing.kill_consumer import CHECKPOINTS

SEGMENTS_PER_VERSION = 1
PACE_TIMEOUT_S = 0.2


def trainer_version(store) -> int:
    """The policy version after the trainer's latest checkpointed step (0 before the first)."""
    checkpoints = store.list(CHECKPOINTS)
    return int(checkpoints[-1].rsplit("/", 1)[1]) + 1 if checkpoints else 0


def main(url: str, producer_id: str, seed: int, segments: int) -> None:
    from relayrl.core.store import open_store

    store = open_store(url)
    writer = SegmentWriter(store, producer_id, groups_per_segment=3)
    rng = random.Random(seed)
    life = uuid.uuid4().hex[:8]  # group ids must stay unique across lives
    print("ready", flush=True)
    count = 0
    paced_version, paced_segments, paced_since = -1, 0, time.monotonic()
    while writer.next_sequence < segments:
        version = trainer_version(store)
        if version != paced_version or time.monotonic() - paced_since > PACE_TIMEOUT_S:
            paced_version, paced_segments, paced_since = version, 0, time.monotonic()
        elif paced_segments >= SEGMENTS_PER_VERSION:
            time.sleep(0.01)
            continue
        kind = rng.choice(["short", "short", "long"])
        rewards = (1.0, 1.0, 1.0) if rng.random() < 0.15 else (0.0, 1.0, rng.random())
        group = make_group(f"{producer_id}-{life}-{count}", task_id=kind, rewards=rewards, generated_tokens=24,
                           context_tokens=8, version=max(0, version - rng.choice([0, 0, 1, 2])),
                           duration_s=30.0 if kind == "short" else 3000.0)
        count += 1
        key = writer.add(group)
        if key is not None:
            paced_segments += 1
            print(f"committed {key}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
