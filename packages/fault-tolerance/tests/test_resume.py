"""kill -9 mid-step, mid-checkpoint-write and at random moments, then resume: bitwise-identical weights."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.fault_tolerance.faults import delete_node_dir
from relayrl.fault_tolerance.peers import PeerServer

SCRIPT = Path(__file__).with_name("trainer_run.py")
STEPS = 6


def run(node, out, *, peer="-", kill=None, check=True):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RELAYRL_FAULT_KILL", None)
    if kill:
        env["RELAYRL_FAULT_KILL"] = kill
    result = subprocess.run([sys.executable, str(SCRIPT), str(node), peer, str(STEPS), str(out)],
                            capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def digest(out) -> tuple[str, int]:
    value, start = Path(out).read_text().split()
    return value, int(start)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> tuple[str, float]:
    """The uninterrupted run's weights digest, and how long the whole run took here."""
    base = tmp_path_factory.mktemp("clean")
    started = time.monotonic()
    run(base / "node", base / "out")
    return digest(base / "out")[0], time.monotonic() - started


@pytest.fixture(scope="module")
def uninterrupted(clean_run) -> str:
    return clean_run[0]


@pytest.mark.parametrize("kill", ["mid-step:3", "mid-write:2", "after-save:4"])
def test_kill_then_resume_is_bitwise_identical(tmp_path, uninterrupted, kill):
    died = run(tmp_path / "node", tmp_path / "out", kill=kill, check=False)
    assert died.returncode == -signal.SIGKILL
    run(tmp_path / "node", tmp_path / "out")
    weights, resumed_from = digest(tmp_path / "out")
    assert resumed_from > 0  # it really resumed
    assert weights == uninterrupted


def test_restore_from_peer_after_the_node_directory_is_lost(tmp_path, uninterrupted):
    with PeerServer(tmp_path / "peer") as peer:
        died = run(tmp_path / "node", tmp_path / "out", peer=f"{peer.url}/rank0", kill="mid-step:4", check=False)
        assert died.returncode == -signal.SIGKILL
        delete_node_dir(tmp_path / "node")
        run(tmp_path / "node", tmp_path / "out", peer=f"{peer.url}/rank0")
    weights, resumed_from = digest(tmp_path / "out")
    # Writes are asynchronous: the kill may have cut the newest checkpoints short, never an old one.
    assert 1 <= resumed_from <= 4 and weights == uninterrupted


def test_random_external_kills_until_done(tmp_path, clean_run):
    """SIGKILLed from outside at random moments (anywhere from the imports to the last step), then
    run to the end: the same weights. The moments scale with this machine's own clean run, so a
    slow machine is killed as often, in the same places, as a fast one; a run that finished before
    its first kill (the machine got faster than during the clean run) starts over, with the moments
    scaled down, so at least one kill always lands."""
    weights, clean_seconds = clean_run
    rng = random.Random(5)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RELAYRL_FAULT_KILL", None)
    scale, kills, out = clean_seconds, 0, tmp_path / "out"
    for fresh_start in range(6):
        node, out = tmp_path / f"node-{fresh_start}", tmp_path / f"out-{fresh_start}"
        argv = [sys.executable, str(SCRIPT), str(node), "-", str(STEPS), str(out)]
        kills = 0
        for _attempt in range(4):
            process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                process.wait(timeout=rng.uniform(0.1, 0.8) * scale)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills += 1
                continue
            assert process.returncode == 0  # it finished before its kill came
            break
        else:
            run(node, out)  # the last start is left to finish
        if kills:
            break
        scale /= 2
    assert kills >= 1
    assert digest(out)[0] == weights
    print(f"finished after {kills} external kills")
