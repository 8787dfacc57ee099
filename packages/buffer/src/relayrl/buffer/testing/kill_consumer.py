"""The trainer stand-in of the exactly-once kill test: trains on batches until killed, or done.

Run as ``python -m relayrl.buffer.testing.kill_consumer STORE_URL CONFIG_JSON SEED TRAIN_S``.

It behaves like a trainer whose checkpoint holds the buffer cursor: on start it restores the latest
checkpoint ``checkpoints/<step>``, then repeatedly polls, takes a batch, "trains" (sleeps up to
``TRAIN_S`` seconds: the policy version advances by one per step), and commits one checkpoint
object holding the step, the trained and dropped group refs and the buffer state, with a
conditional create: that object *is* the trained step, so "trained on" means "in a committed
checkpoint". It prints ``ready``, ``batch N`` and ``step N`` lines so the test can kill it at
random points of that cycle. When ``control/done`` exists (no more segments will come) and
nothing is pending, it writes ``control/finished`` and exits.
"""

from __future__ import annotations

import json
import random
import sys
import time

import msgspec

from relayrl.buffer.buffer import Buffer
from relayrl.buffer.config import BufferSection
from relayrl.buffer.cursor import BufferState

CHECKPOINTS = "checkpoints/"
DONE = "control/done"
FINISHED = "control/finished"


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint: what the step trained on and the buffer cursor after it."""

    step: int
    trainer_version: int
    trained: list[str]
    """Group refs (``producer/sequence/index``) in batch order."""
    trained_group_ids: list[str]
    staleness: list[int]
    dropped: list[tuple[str, str]]
    """(group ref, reason)."""
    state: bytes


def checkpoint_key(step: int) -> str:
    return f"{CHECKPOINTS}{step:08d}"


def read_records(store) -> list[StepRecord]:
    """All committed checkpoints, in step order."""
    return [msgspec.msgpack.decode(store.get(key), type=StepRecord) for key in store.list(CHECKPOINTS)]


def main(url: str, config_json: str, seed: int, train_s: float) -> None:
    from relayrl.core.store import open_store

    store = open_store(url)
    config = msgspec.convert(json.loads(config_json), BufferSection)
    buffer = Buffer(store, config)
    rng = random.Random(seed)
    keys = store.list(CHECKPOINTS)
    step = 0
    if keys:
        last = msgspec.msgpack.decode(store.get(keys[-1]), type=StepRecord)
        buffer.restore(BufferState.coerce(last.state))
        step = last.step + 1
    version = step  # one policy version per optimiser step
    print("ready", flush=True)
    while True:
        done = store.exists(DONE)  # before the poll: everything committed before `done` is then listed
        buffer.poll()
        batch = buffer.next_batch(version, partial=done)
        if batch is None:
            if done and buffer.pending == 0:
                if not store.exists(FINISHED):
                    store.put(FINISHED, b"", if_absent=True)
                print("finished", flush=True)
                return
            time.sleep(0.005)
            continue
        print(f"batch {step}", flush=True)
        time.sleep(rng.uniform(0, train_s))  # the optimiser step
        record = StepRecord(step=step, trainer_version=version, trained=[str(g.ref) for g in batch.groups],
                            trained_group_ids=[g.group.group_id for g in batch.groups],
                            staleness=[g.staleness for g in batch.groups],
                            dropped=[(str(d.ref), d.reason) for d in batch.dropped], state=batch.state.to_bytes())
        store.put(checkpoint_key(step), msgspec.msgpack.encode(record), if_absent=True)
        print(f"step {step}", flush=True)
        step += 1
        version += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
