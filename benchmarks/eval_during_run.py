"""What held-out evaluation during a run (``[eval]``) costs the training: steps/s with and without it.

Runs ``relayrl run examples/quickstart.toml`` with the same seed and number of steps, without and
with ``[eval]`` (every ``--every`` steps, ``--tasks`` held-out tasks x ``--samples`` samples through
the same fleet), alternating ``--repeats`` times so that drift of a noisy machine hits both alike.
Prints per run the trainer's steps/s over the RL phase, the mean wall time of a step, and the
evaluations done; then the ratio with/without of the median steps/s. The issue's bar: no more
than 10% slower (a ratio of at least 0.90).

Usage: ``python benchmarks/eval_during_run.py [--steps N] [--every N] [--tasks N] [--samples N]
[--repeats N] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.toml"
# The smoke run's model solves nothing: keep every group so that steps happen at all.
QUICK = ["--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']",
         "--set", "rollout.engines_in_process=true"]  # one process start fewer


def run(run_dir: Path, steps: int, extra: list[str], quick: bool) -> dict[str, float]:
    command = [sys.executable, "-m", "relayrl.cli", "run", str(QUICKSTART), "--run-dir", str(run_dir),
               "--steps", str(steps), "--no-report", *extra, *(QUICK if quick else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"run failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = max(records[-1]["time"] - records[0]["time"], 1e-9)
    evaluations = []
    results = run_dir / "eval" / "run.jsonl"
    if results.exists():
        evaluations = [json.loads(line) for line in results.read_text().splitlines()]
    return {"steps_per_s": (len(records) - 1) / elapsed,
            "step_s": statistics.fmean(record["metrics"]["trainer/wall_step_s"] for record in records),
            "evaluations": len(evaluations),
            "eval_s": statistics.fmean(item["wall_s"] for item in evaluations) if evaluations else 0.0,
            "pass@1": evaluations[-1]["pass@1"] if evaluations else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20, help="[eval] every_steps")
    parser.add_argument("--tasks", type=int, default=64, help="[eval] tasks")
    parser.add_argument("--samples", type=int, default=8, help="[eval] samples")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, one repeat, a small eval")
    parser.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.every, args.tasks, args.samples, args.repeats = 4, 2, 8, 2, 1
    revision = commit()
    variants = {"without": [], "with": ["--set", f"eval.every_steps={args.every}", "--set", f"eval.tasks={args.tasks}",
                                        "--set", f"eval.samples={args.samples}"]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as temp:
        runs = Path(args.runs_dir or temp)
        for repeat in range(args.repeats):
            for name, extra in variants.items():
                results[name].append(run(runs / f"{name}-{repeat}", args.steps, extra, args.quick))
                print(f"{name} [eval], run {repeat + 1}: done", file=sys.stderr)
    lines = [f"Quickstart, {args.steps} steps; [eval] every {args.every} steps, {args.tasks} tasks x {args.samples} "
             f"samples; {args.repeats} run(s) each, alternating.", "",
             "| variant | run | steps/s | mean step s | evaluations | mean eval s | last pass@1 |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        for index, item in enumerate(runs):
            lines.append(f"| {name} | {index + 1} | {item['steps_per_s']:.3f} | {item['step_s']:.3f} | "
                         f"{item['evaluations']} | {item['eval_s']:.1f} | {item['pass@1']:.3f} |")
    ratio = (statistics.median(item["steps_per_s"] for item in results["with"])
             / statistics.median(item["steps_per_s"] for item in results["without"]))
    lines += ["", f"steps/s with / without [eval] (medians): **{ratio:.3f}** (the bar: >= 0.90)."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("eval_during_run", command=command_line(argv), markdown=markdown,
                             data={"results": results, "ratio": ratio}, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
