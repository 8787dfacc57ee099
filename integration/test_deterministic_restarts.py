"""Deterministic mode survives restarts: the real trainer process, SIGKILLed, ends bit for bit where an
uninterrupted one does (design invariant 4).

A short deterministic quickstart run leaves its rollouts on the bus. Each case copies that bus into two
fresh run directories (config, model and rollout segments only: no checkpoint, weight or ledger) and
runs ``python -m relayrl.cli.run.trainer_process`` on them, the process ``relayrl run`` supervises, with
nothing else running: the frozen rollouts are all it trains on. One trainer runs to the end; the other
is SIGKILLed during its supervised warm-up, between writing a checkpoint shard and its commit record,
and at seeded random moments of seeded steps (mid-step, mid-publish, mid-checkpoint), and restarted
each time, as the launcher would. Then every step's checkpoint (model, optimiser state, RNG, buffer
cursor, monitors) and every published weight version must be bitwise equal, no version may have been
renumbered, and ``verify_run`` must find every group trained exactly once.

Backends: torch (Muon + AdamW, float32; also with a checkpoint every 3 steps, whose kills cost redone
steps), and DeepSpeed ZeRO-1 and ZeRO-2 with DeepSpeed's Muon and bf16;
and the mixture-of-experts quickstart (examples/moe.toml: bfloat16 engine, routing replay) on torch.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from relayrl.cli.report import load_events
from relayrl.cli.run.ledger import verify_run
from relayrl.core.store import open_store
from relayrl.fault_tolerance.faults import ENV as FAULT_KILL
from relayrl.trainer.metrics import read_metrics
from relayrl.weight_sync import WeightBus

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
SEED = int(os.environ.get("RELAYRL_RESTART_SEED", "23"))
# The rollouts: a short deterministic quickstart (a warm-up long enough that some answers are right, so
# groups carry real advantages). Zero-variance groups are trained too: every group the fleet made counts.
FROZEN_RUN = ["--steps", "14", "--no-report", "--set", "run.deterministic=true", "--set", "trainer.warmup.steps=40",
              "--set", "rollout.environment_options.tasks=2000", "--set", "buffer.batch_groups=4",
              "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']"]
ZIP = b"PK\x03\x04"
BACKENDS = {
    "torch": {},
    "torch-moe-routing-replay": {},  # over the MoE run's rollouts (FROZEN_EXAMPLE)
    # A checkpoint every 3 steps: a kill loses up to 2 steps, which the resumed trainer redoes.
    "torch-checkpoint-every-3": {"trainer": {"checkpoint_every": 3}},
    "deepspeed-zero1-muon-bf16": {"trainer": {"backend": "deepspeed"}, "model": {"dtype": "bfloat16"},
                                  "deepspeed": {"zero_stage": 1, "bf16": True, "muon": True}},
    "deepspeed-zero2-muon-bf16": {"trainer": {"backend": "deepspeed"}, "model": {"dtype": "bfloat16"},
                                  "deepspeed": {"zero_stage": 2, "bf16": True, "muon": True}},
}


FROZEN_EXAMPLE = {"torch-moe-routing-replay": "moe.toml"}
"""The example whose rollouts a case trains on (default: the quickstart)."""


@pytest.fixture(scope="module")
def frozen_runs(tmp_path_factory):
    """The frozen run of an example, made once per module on first use."""
    made: dict[str, Path] = {}

    def frozen(example: str) -> Path:
        if example not in made:
            run_dir = tmp_path_factory.mktemp("frozen") / "run"
            run = subprocess.run([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples" / example),
                                  "--run-dir", str(run_dir), *FROZEN_RUN], capture_output=True, text=True, timeout=900)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            made[example] = run_dir
        return made[example]
    return frozen


def replay_dir(frozen: Path, target: Path, overrides: dict[str, dict[str, Any]]) -> Path:
    """A fresh run directory over ``frozen``'s rollouts: its config (plus ``overrides``), model and segments."""
    target.mkdir(parents=True)
    config = json.loads((frozen / "config.json").read_text())
    for section, values in [("trainer", {"steps": STEPS, "checkpoint_keep": 100}), *overrides.items()]:
        config.setdefault(section, {}).update(values)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    for part in ("model", "rollouts"):
        shutil.copytree(frozen / part, target / part)
    return target


def trainer(run_dir: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "relayrl.cli.run.trainer_process", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **env))


def finish(process: subprocess.Popen, timeout_s: float = 600) -> str:
    output, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, output[-4000:]
    return output


def phase(run_dir: Path, since: float) -> str:
    """The trainer's phase, as written by a process started at ``since`` (earlier ones' status is stale)."""
    status = run_dir / "status" / "trainer.json"
    try:
        return json.loads(status.read_text()).get("phase", "") if status.stat().st_mtime >= since else ""
    except (FileNotFoundError, json.JSONDecodeError):
        return ""


def last_step(run_dir: Path) -> int:
    records = read_metrics(run_dir)
    return records[-1]["step"] if records else 0


def kill_when(process: subprocess.Popen, ready, delay_s: float, what: str, log: list[str]) -> None:
    """SIGKILL ``process`` ``delay_s`` after ``ready()`` first holds (or note that it ended first)."""
    deadline = time.monotonic() + 600
    while not ready():
        if process.poll() is not None:
            pytest.fail(f"the trainer exited ({process.returncode}) before {what}:\n{process.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    time.sleep(delay_s)
    process.kill()
    process.communicate(timeout=60)
    log.append(f"{what} + {delay_s:.2f} s")


def checkpointed_steps(every: int) -> list[int]:
    """The steps a run of STEPS steps checkpoints with ``trainer.checkpoint_every = every``."""
    return [step for step in range(1, STEPS + 1) if step % every == 0 or step == STEPS]


def run_with_kills(run_dir: Path, rng: random.Random, every: int = 1) -> list[str]:
    """Train ``run_dir`` to the end through SIGKILLs at chosen moments; returns the kill log."""
    log: list[str] = []
    # During the supervised warm-up (nothing checkpointed yet: it starts again).
    since = time.time()
    kill_when(trainer(run_dir), lambda: phase(run_dir, since) == "warmup", rng.uniform(0.0, 0.5), "warm-up", log)
    # Between a checkpoint's shard and its commit record (the torn checkpoint is never loaded).
    torn = rng.choice([step for step in checkpointed_steps(every) if 2 <= step <= 4])
    process = trainer(run_dir, **{FAULT_KILL: f"mid-write:{torn}"})
    process.communicate(timeout=600)
    assert process.returncode == -signal.SIGKILL, f"the mid-write kill at step {torn} did not happen"
    log.append(f"checkpoint of step {torn}, shard written, commit not")
    # At random moments of random later steps, once the restarted trainer trains (resumed, published).
    for step in sorted(rng.sample(range(torn + 1, STEPS), 3)):
        since = time.time()
        kill_when(trainer(run_dir), lambda step=step, since=since: phase(run_dir, since) == "training"
                  and last_step(run_dir) >= step - 1, rng.uniform(0.0, 0.4), f"step {step}", log)
    finish(trainer(run_dir))
    return log


def load_checkpoint(run_dir: Path, step: int) -> Any:
    return torch.load(run_dir / "checkpoints" / f"step-{step:09d}" / "rank-00000.pt", weights_only=False,
                      map_location="cpu")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two checkpoint states differ; tensors must match bit for bit (dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"]
        same = torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
        return [] if same else [f"{path}: tensor bits differ"]
    if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        same = (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
        return [] if same else [f"{path}: array bits differ"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))} in one only"]
        return [found for key in a for found in differences(a[key], b[key], f"{path}/{key}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [found for index, (x, y) in enumerate(zip(a, b)) for found in differences(x, y, f"{path}[{index}]")]
    if isinstance(a, bytes) and isinstance(b, bytes) and a[:4] == b[:4] == ZIP:
        # A file a backend saved with torch.save (DeepSpeed's shards): its contents must match, not its
        # bytes (after a restore, tensors that hold the same bits may sit in differently laid out storages).
        return differences(torch.load(io.BytesIO(a), weights_only=False, map_location="cpu"),
                           torch.load(io.BytesIO(b), weights_only=False, map_location="cpu"), path)
    if a == b:
        return []
    if type(a) is type(b) and hasattr(a, "__dict__") and not isinstance(a, type):  # e.g. a loss scaler
        return differences(vars(a), vars(b), path)
    return [f"{path}: {a!r} vs {b!r}"[:300]]


def published(run_dir: Path) -> dict[int, list[tuple[str, str, tuple[int, ...], str]]]:
    """Every committed weight version: each tensor's name, dtype, shape and checksum of its bits."""
    bus = WeightBus(open_store(str(run_dir)))
    return {version: [(entry.name, entry.dtype, tuple(entry.shape), entry.checksum)
                      for entry in bus.read_manifest(version).tensors]
            for version in bus.committed_versions()}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_sigkilled_deterministic_trainer_ends_bitwise_equal_to_an_uninterrupted_one(frozen_runs, tmp_path,
                                                                                        backend):
    if backend.startswith("deepspeed"):
        pytest.importorskip("relayrl_deepspeed", reason="needs the relayrl-deepspeed plugin (and DeepSpeed)")
    frozen_rollouts = frozen_runs(FROZEN_EXAMPLE.get(backend, "quickstart.toml"))
    clean = replay_dir(frozen_rollouts, tmp_path / "clean", BACKENDS[backend])
    killed = replay_dir(frozen_rollouts, tmp_path / "killed", BACKENDS[backend])
    finish(trainer(clean))
    rng = random.Random(f"{SEED}-{backend}")
    every = BACKENDS[backend].get("trainer", {}).get("checkpoint_every", 1)
    log = run_with_kills(killed, rng, every)
    replay = f"kills ({backend}, RELAYRL_RESTART_SEED={SEED}): {log}"

    for step in checkpointed_steps(every):
        found = differences(load_checkpoint(clean, step), load_checkpoint(killed, step))
        assert not found, f"step {step}'s checkpoint differs after {replay}:\n" + "\n".join(found[:20])
    versions = published(clean)
    assert len(versions) == STEPS + 1  # the start (version 1) and one per step
    assert published(killed) == versions, replay
    events = load_events(killed)
    assert not [event.message for event in events if event.kind == "weights-renumbered"], replay
    # The kills after a checkpoint resumed (with a checkpoint every 3 steps, the torn one at step 3 and a
    # kill before step 6's leave nothing to resume from: those runs start again).
    assert sum(event.kind == "resumed" for event in events) >= (3 if every == 1 else 1), replay
    if every > 1:  # steps after a checkpoint were trained, lost to a kill and redone
        lines = Counter(json.loads(line)["step"] for line in (killed / "ledger.jsonl").read_text().splitlines())
        assert any(count > 1 and step % every for step, count in lines.items()), (lines, replay)
    # Redone steps wrote their ledger lines again; the last line per step is what counts, and each group
    # on the bus was trained once or dropped once with a reason.
    audit = verify_run(killed)
    assert audit.ok, f"{audit.errors} after {replay}"
    assert last_step(killed) == STEPS
    # Some batches carried real advantages (not only the entropy bonus's gradient).
    assert any(record["metrics"]["advantage/abs_max"] > 0 for record in read_metrics(clean))
    if backend in FROZEN_EXAMPLE:  # the MoE run: every step replayed the engine's routing
        assert all(record["metrics"]["routing/replayed"] == 1.0 for record in read_metrics(clean))
