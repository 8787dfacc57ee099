"""One cell of the backend matrix: a short ``relayrl run`` of the quickstart on the cell's backends.

It checks that the whole pipeline ran on them (three trainer steps, weight versions applied by every
engine, token versions stamped consistently, groups consumed exactly once), never how well it learned;
then that ``relayrl eval`` of the run's newest weights (rebuilt from the cell's bus) runs on the
cell's engine and router.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cells import overrides

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--steps", "3", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']"]
# Not the defaults: the run's [weight_sync] must reach every engine, whichever backend hosts it.
WEIGHT_SYNC = ["--set", "weight_sync.apply_mode='xor'", "--set", "weight_sync.verify_after_apply=false"]


def test_a_short_run_on_the_cells_backends(cell, tmp_path, request):
    from relayrl.cli.run.ledger import verify_run
    from relayrl.trainer.metrics import read_metrics

    run_dir = tmp_path / "run"
    store = []
    if cell["store"] == "s3":
        store = ["--set", f"store.url='{request.getfixturevalue('s3_url')}'"]
    command = [sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples" / "quickstart.toml"),
               "--run-dir", str(run_dir), "--no-report", *SHORT, *WEIGHT_SYNC, *overrides(cell), *store]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    logs = "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted((run_dir / "logs").glob("*.log")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs

    assert [record["step"] for record in read_metrics(run_dir)] == [1, 2, 3]
    status = json.loads((run_dir / "status" / "rollout.json").read_text())
    engines = status["engines"]
    assert len(engines) == 1 and all(engine["weight_updates"] >= 1 and engine["version"] >= 1 for engine in engines)
    assert all(engine.get("version_mismatches", 0) == 0 for engine in engines)
    settings = [engine["weight_sync"]["settings"] for engine in engines]
    assert all(item["apply_mode"] == "xor" and item["verify_after_apply"] is False for item in settings), settings
    assert status["metrics"]["sandbox/graded_answers"] > 0
    check = verify_run(run_dir)
    assert check.ok, check.errors
    assert check.trained > 0
    if cell["router"] == "dynamo":  # engines registered through file discovery under the run directory
        assert (run_dir / "dynamo").is_dir()
    if cell["store"] == "s3":
        assert not (run_dir / "rollouts").exists() and not (run_dir / "weights").exists()

    evaluation = subprocess.run([sys.executable, "-m", "relayrl.cli", "eval", str(run_dir), "--tasks", "countdown",
                                 "--limit", "4", "--samples", "2", "--out", str(tmp_path / "eval")],
                                capture_output=True, text=True, timeout=600)
    assert evaluation.returncode == 0, evaluation.stdout[-3000:] + evaluation.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["overall"]["samples"] == 8 and summary["spec"]["version"] >= 3
