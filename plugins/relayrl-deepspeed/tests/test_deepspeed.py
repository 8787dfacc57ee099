"""The DeepSpeed backend with 2 processes on gloo: same loss and gradients as the torch backend."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("ds_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CONFIGURATIONS = [(1, False, False), (2, False, False), (3, False, False), (2, True, True), (3, True, True)]
"""(ZeRO stage, bf16, Muon): every configuration the tests below compare with the torch backend."""


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[int, bool, bool], dict]:
    """One launch of two ranks runs every configuration (a launch costs far more than a configuration)."""
    out = tmp_path_factory.mktemp("ds-reports")
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1")
    listing = ",".join(f"{stage}:{int(bf16)}:{int(muon)}" for stage, bf16, muon in CONFIGURATIONS)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(WORKER), listing, str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return {(stage, bf16, muon): json.loads((out / f"stage{stage}-{int(bf16)}-{int(muon)}.json").read_text())
            for stage, bf16, muon in CONFIGURATIONS}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fp32_gradients_match_the_torch_backend(reports, stage):
    report = reports[stage, False, False]
    assert report["optimizer"] == "AdamW" and report["muon_parameters"] == []
    assert report["missing"] == []
    assert report["targets"] == report["reference_targets"]
    assert report["loss"] == pytest.approx(report["reference_loss"], rel=1e-5, abs=1e-6)
    assert report["max_grad_diff"] <= 1e-5 * max(1.0, report["max_grad"])
    assert report["published_shapes_ok"]
    assert report["full_state_names_ok"] and report["full_state_matches"]  # tied names included, gathered whole


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_with_muon_trains_and_publishes(reports, stage):
    report = reports[stage, True, True]
    assert report["optimizer"] == "Muon"
    assert report["muon_parameters"] and all("proj" in name for name in report["muon_parameters"])
    assert report["missing"] == []  # AdamW parameters (embeddings, norms) compared in bf16
    assert report["loss"] == pytest.approx(report["reference_loss"], rel=0.05, abs=1e-3)
    assert report["max_grad_diff"] <= 0.1 * max(report["max_grad"], 1e-6)
    assert report["published_shapes_ok"] and report["published_finite"]
    assert set(report["muon_parameters"]) <= set(report["changed_by_step"])  # Muon stepped the hidden matrices


RESUME_WORKER = Path(__file__).with_name("ds_resume_worker.py")


def resume_run(node, peer, out, *, kill=None, steps=5, stage=3):
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1")
    env.pop("RELAYRL_FAULT_KILL", None)
    if kill:
        env["RELAYRL_FAULT_KILL"] = kill
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(RESUME_WORKER), str(stage), str(node), peer, str(steps), str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def failure(result: subprocess.CompletedProcess) -> str:
    """What a failed torchrun printed, each rank's own last lines first (the tail alone is often just
    the peer that saw the first one die)."""
    ranks = {}
    for line in result.stderr.splitlines():
        if line.startswith("[rank") and "]:" in line:
            ranks.setdefault(line.split("]:", 1)[0] + "]", []).append(line)
    own = "\n".join(line for lines in ranks.values() for line in lines[-40:])
    return f"{own}\n--- tail ---\n{result.stderr[-3000:]}"


def test_zero3_rank_killed_mid_step_resumes_bitwise_from_shards_replicated_to_a_peer(tmp_path):
    from relayrl.fault_tolerance.faults import delete_node_dir
    from relayrl.fault_tolerance.peers import PeerServer

    clean = resume_run(tmp_path / "clean", "-", tmp_path / "clean.txt")
    assert clean.returncode == 0, failure(clean)
    expected = (tmp_path / "clean.txt").read_text().split()[0]
    with PeerServer(tmp_path / "peer") as peer:
        died = resume_run(tmp_path / "node", f"{peer.url}/node", tmp_path / "out.txt", kill="mid-step:3")
        assert died.returncode != 0 and not (tmp_path / "out.txt").exists()
        delete_node_dir(tmp_path / "node")  # and the node's disk is gone too: every shard comes from the peer
        resumed = resume_run(tmp_path / "node", f"{peer.url}/node", tmp_path / "out.txt")
    assert resumed.returncode == 0, failure(resumed)
    digest, start = (tmp_path / "out.txt").read_text().split()
    assert 1 <= int(start) <= 3  # it really resumed, from a checkpoint complete for both ranks
    assert digest == expected  # bitwise: ZeRO-3 partitions, optimiser state and all
