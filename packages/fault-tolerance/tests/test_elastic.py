"""Elastic data parallelism: 2 replicas -> one SIGKILLed -> 1 replica -> it comes back -> 2, same global batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from relayrl.core.store import open_store
from relayrl.fault_tolerance.membership import StoreMembership

WORKER = Path(__file__).with_name("elastic_worker.py")
STEPS = 14

sys.path.insert(0, str(WORKER.parent))
from elastic_worker import batch, make_trainer  # noqa: E402


def start(member: str, directory: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(directory / f"stderr-{member}.txt", "ab") as stderr:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, str(WORKER), member, str(directory), str(STEPS)], env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)


def log(directory: Path, member: str) -> list[dict]:
    path = directory / f"log-{member}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_membership_heartbeats_and_views(tmp_path):
    membership = StoreMembership(open_store(str(tmp_path)), ttl_s=5.0)
    membership.beat("b")
    membership.beat("a")
    assert membership.alive() == ["a", "b"]
    view = membership.propose(["b", "a"])  # rank order as given: existing members first
    assert (view.generation, view.members, view.rank("a"), view.world_size) == (1, ["b", "a"], 1, 2)
    assert membership.propose(["b", "a"]) is None  # nothing changed
    assert membership.propose(["b", "a"], after=1).generation == 2  # a failed group re-forms anyway
    membership.leave("b")
    assert membership.alive() == ["a"]
    membership.store.put("membership/members/c", b'{"time": 0}')  # a beat from long ago
    assert membership.alive() == ["a"]


def test_shrink_to_one_replica_and_regrow_keeps_the_global_batch(tmp_path):
    membership = StoreMembership(open_store(str(tmp_path / "bus")), ttl_s=1.5)
    pause = tmp_path / "pause"
    pause.touch()  # start both replicas, let them find each other, then train
    a, b = start("a", tmp_path), start("b", tmp_path)
    try:
        wait_for(lambda: membership.alive() == ["a", "b"], "both replicas beating")
        pause.unlink()
        wait_for(lambda: any(r["world"] == 2 for r in log(tmp_path, "a")) and len(log(tmp_path, "b")) >= 2,
                 "both replicas training together")
        b.send_signal(signal.SIGKILL)  # anywhere in a step: mid-forward, mid-all-reduce ...
        b.wait()
        killed_at = len(log(tmp_path, "a"))
        wait_for(lambda: sum(r["world"] == 1 for r in log(tmp_path, "a")[killed_at:]) >= 2, "the survivor training alone")
        pause.touch()
        b = start("b", tmp_path)  # the replica comes back
        wait_for(lambda: membership.alive() == ["a", "b"], "the new replica beating")
        pause.unlink()
        assert a.wait(timeout=300) == 0, (tmp_path / "stderr-a.txt").read_text()[-3000:]
        assert b.wait(timeout=300) == 0, (tmp_path / "stderr-b.txt").read_text()[-3000:]
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()

    history = log(tmp_path, "a")
    first = history[0]["step"]
    assert [r["step"] for r in history] == list(range(first, STEPS))  # every step once: a failed one is redone
    worlds = [r["world"] for r in history]
    alone = [index for index, world in enumerate(worlds) if world == 1.0]
    assert alone and 2.0 in worlds[:alone[0]] and 2.0 in worlds[alone[-1]:], worlds  # 2 -> 1 -> 2

    # The same global batch throughout: each step's loss, and the final weights, are the single-process run's.
    reference = make_trainer()
    losses = [reference.step(batch(step))["loss/value"] for step in range(STEPS)]
    assert [r["loss"] for r in history] == pytest.approx(losses[first:], rel=1e-4, abs=1e-6)
    final_a, final_b = torch.load(tmp_path / "final-a.pt"), torch.load(tmp_path / "final-b.pt")
    for name, value in reference.model.state_dict().items():
        assert torch.equal(final_a[name], final_b[name]), name  # replicas never diverge
        torch.testing.assert_close(final_a[name], value, rtol=1e-4, atol=1e-5)
