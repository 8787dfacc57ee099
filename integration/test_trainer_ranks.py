"""``relayrl run`` with a data-parallel trainer: two DeepSpeed ZeRO-3 bf16 ranks on gloo, one SIGKILLed mid-run.

Rank 0 leads (buffer, publishing, metrics); rank 1 follows its decisions. Killing rank 1 breaks the
process group, so the launcher stops the whole trainer and restarts both ranks, which resume from
the newest checkpoint both committed: the run must still reach its last step with every group
trained exactly once, its weights published tensor by tensor (gathered from ZeRO-3 shards) and
applied by the engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.cli.report import load_events
from relayrl.cli.run.ledger import verify_run
from relayrl.trainer.metrics import read_metrics

pytest.importorskip("relayrl_deepspeed", reason="needs the relayrl-deepspeed plugin (and DeepSpeed)")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
ARGS = ["--steps", str(STEPS), "--no-report", "--set", "trainer.warmup.steps=3",
        "--set", "rollout.environment_options.tasks=500", "--set", "buffer.batch_groups=2",
        "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
        "--set", "trainer.backend=deepspeed", "--set", "trainer.ranks=2",
        "--set", "deepspeed.zero_stage=3", "--set", "model.dtype=bfloat16"]  # DeepSpeed's default: bf16


def test_two_zero3_ranks_survive_the_loss_of_one(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                            "--run-dir", str(run_dir), *ARGS],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killed = False
    try:
        deadline = time.monotonic() + 900
        while run.poll() is None and time.monotonic() < deadline and not killed:
            if len(read_metrics(run_dir)) >= 2:
                children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
                os.kill(children["trainer-1"], signal.SIGKILL)
                killed = True
            time.sleep(0.2)
        output, _ = run.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if run.poll() is None:
            run.kill()
    logs = "\n".join(f"--- {path.name}\n{path.read_text()[-2500:]}" for path in sorted((run_dir / "logs").glob("*.log")))
    assert run.returncode == 0, output[-3000:] + logs
    assert killed

    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    assert all(record["metrics"]["trainer/world_size"] == 2.0 for record in records)
    events = load_events(run_dir)
    restarts = [event for event in events if event.kind == "restart"]
    assert [event.data["process"] for event in restarts] == ["trainer"], restarts
    assert "process trainer-1" in restarts[0].message  # which rank died
    assert sum(event.kind == "resumed" for event in events) == 1
    assert (run_dir / "logs" / "trainer-1.log").exists()

    # Both ranks committed their shard of the last step's checkpoint.
    for rank in (0, 1):
        assert list(run_dir.rglob(f"step-{STEPS:09d}/rank-{rank:05d}.commit")), rank

    # The engines serve bf16 (model.dtype), which the trainer publishes: versions apply bit-exactly, and on
    # on-policy batches (staleness 0: same weights) the engines' logprobs match the trainer's replay closely.
    status = json.loads((run_dir / "status" / "rollout.json").read_text())
    assert all(engine["weight_updates"] >= 1 for engine in status["engines"])
    on_policy = [record["metrics"] for record in records if record["metrics"]["staleness/mean"] == 0]
    assert on_policy and all(abs(metrics["mismatch/kl_k3"]) < 1e-4 for metrics in on_policy)
    assert max(record["metrics"].get("weight_sync/delta_ratio", 0) for record in records) > 1

    check = verify_run(run_dir)
    assert check.ok, "\n".join(check.errors)
    assert check.final_step == STEPS and check.trained >= STEPS * 2
