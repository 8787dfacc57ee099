"""The quickstart asynchronous vs synchronous: wall time to a reward target, and throughput.

Two ``relayrl run examples/quickstart.toml`` runs, same seed, same number of trainer steps:

* ``synchronous``: ``buffer.staleness.max_staleness = 0`` (only groups sampled entirely by the
  trainer's current weights are trained on) and ``rollout.max_ahead_groups = buffer.batch_groups``
  (the fleet produces one batch, then waits): generation and training alternate.
* ``asynchronous``: the quickstart as shipped (staleness up to 2, the fleet up to 24 groups ahead):
  the engine samples while the trainer steps.

Printed per run: wall time from the first trainer step to the target (the success rate averaged
over 20 steps reaching ``--target``), steps/s, fleet tokens/s, mean staleness, final success rate;
then asynchronous / synchronous ratios. Measured on whatever machine runs it: on 2 CPU cores the
engine and the trainer compete for the same cores, so the gain is bounded by how idle each side
would be in the other's turn. Usage: ``python benchmarks/async_vs_sync.py [--steps N] [--target R] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.toml"
BATCH_GROUPS = 8
MODES = {
    "synchronous": ["--set", "buffer.staleness.max_staleness=0", "--set", f"rollout.max_ahead_groups={BATCH_GROUPS}"],
    "asynchronous": [],
}
# The smoke run's model solves nothing: keep every group so that steps happen at all.
QUICK = ["--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']",
         "--set", "rollout.engines_in_process=true"]  # one process start fewer


def run(mode: str, run_dir: Path, steps: int, quick: bool) -> list[dict]:
    command = [sys.executable, "-m", "relayrl.cli", "run", str(QUICKSTART), "--run-dir", str(run_dir),
               "--steps", str(steps), "--no-report", "--set", f"buffer.batch_groups={BATCH_GROUPS}",
               *MODES[mode], *(QUICK if quick else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{mode} run failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarise(records: list[dict], target: float, window: int = 20) -> dict[str, float | None]:
    start = records[0]["time"]
    rewards = [record["metrics"].get("reward/fleet_mean") for record in records]
    reached = None
    for index in range(len(records)):
        recent = [r for r in rewards[max(0, index - window + 1):index + 1] if r is not None]
        if len(recent) == window and sum(recent) / window >= target:
            reached = records[index]["time"] - start
            break
    elapsed = max(records[-1]["time"] - start, 1e-9)
    tail = [r for r in rewards[-window:] if r is not None]
    staleness = [record["metrics"].get("staleness/mean", 0.0) for record in records]
    return {"time_to_target_s": reached, "steps_per_s": (len(records) - 1) / elapsed,
            "fleet_tokens_per_s": records[-1]["metrics"].get("fleet/tokens_per_s", 0.0),
            "staleness_mean": sum(staleness) / len(staleness), "final_success": sum(tail) / len(tail) if tail else 0.0,
            "wall_s": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=350)
    parser.add_argument("--target", type=float, default=0.10, help="success rate (20-step mean) to reach")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 steps each")
    args = parser.parse_args(argv)
    steps = 3 if args.quick else args.steps
    results = {}
    with tempfile.TemporaryDirectory() as temp:
        for mode in MODES:
            results[mode] = summarise(run(mode, Path(temp) / mode, steps, args.quick), args.target)
            print(f"{mode}: done", file=sys.stderr)

    def show(value: float | None, fmt: str) -> str:
        return "not reached" if value is None else format(value, fmt)

    print(f"{steps} trainer steps each, batch {BATCH_GROUPS} groups x 8; target: 20-step success rate >= {args.target}")
    print("mode | time to target (s) | steps/s | fleet tokens/s | staleness | final success | wall (s)")
    for mode, summary in results.items():
        print(f"{mode} | {show(summary['time_to_target_s'], '.0f')} | {summary['steps_per_s']:.2f} | "
              f"{summary['fleet_tokens_per_s']:.0f} | {summary['staleness_mean']:.2f} | {summary['final_success']:.3f} | "
              f"{summary['wall_s']:.0f}")
    sync, asyn = results["synchronous"], results["asynchronous"]
    print(f"throughput, asynchronous / synchronous: {asyn['steps_per_s'] / max(sync['steps_per_s'], 1e-9):.2f}x steps/s")
    if sync["time_to_target_s"] and asyn["time_to_target_s"]:
        print(f"time to target, synchronous / asynchronous: {sync['time_to_target_s'] / asyn['time_to_target_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
