"""kill -9 mid-step, mid-checkpoint-write and at random moments, then resume: bitwise-identical weights."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
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
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("clean")
    run(base / "node", base / "out")
    return digest(base / "out")[0]


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
    assert resumed_from == 4 and weights == uninterrupted


def test_random_external_kills_until_done(tmp_path, uninterrupted):
    rng = random.Random(5)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RELAYRL_FAULT_KILL", None)
    kills = 0
    for _attempt in range(12):
        process = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / "node"), "-", str(STEPS),
                                    str(tmp_path / "out")], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            process.wait(timeout=rng.uniform(3.0, 7.0))  # imports take ~3 s, then a step every ~0.1 s
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
            continue
        assert process.returncode == 0
        break
    else:
        pytest.fail("the run never finished")
    assert digest(tmp_path / "out")[0] == uninterrupted
    print(f"finished after {kills} external kills")
