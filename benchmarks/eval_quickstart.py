"""The quickstart model before and after RL, measured by ``relayrl eval``: the table of docs/eval.md.

Runs ``relayrl run examples/quickstart.toml`` (unless ``--run-dir`` already holds a finished run),
keeping version 1 on the weight bus (``weight_sync.keep_every``), then evaluates two versions of its
policy on countdown's held-out tasks with the same seed: version 1 (after the supervised warm-up,
before any RL step) and the newest (after RL). Prints a
markdown table: pass@1, pass@8, mean reward, tokens per sample and per solved sample, and the
evaluation's wall time.

Usage: ``python benchmarks/eval_quickstart.py [--run-dir DIR] [--samples N] [--limit N] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.toml"
QUICK_RUN = ["--steps", "3", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
             "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
             "--set", "buffer.admission=['staleness']",
             "--set", "rollout.engines_in_process=true"]  # one process start fewer


def relayrl(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "relayrl.cli", *args], capture_output=True, text=True, timeout=7200)
    if result.returncode != 0:
        raise SystemExit(f"relayrl {args[0]} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def evaluate(model: str, out: Path, samples: int, limit: int | None) -> dict:
    relayrl("eval", model, "--tasks", "countdown", "--split", "eval", "--samples", str(samples),
            "--k", f"1,{samples}", "--out", str(out), *(["--limit", str(limit)] if limit else []))
    summary = json.loads((out / "summary.json").read_text())
    state = json.loads((out / "eval.json").read_text())
    summary["wall_s"] = sum(session["seconds"] for session in state["sessions"])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default=None, help="a quickstart run to evaluate (run here when it has none)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="held-out tasks (default: all 200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 steps, 8 tasks x 2 samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.limit = 2, 8
    revision = commit()
    with tempfile.TemporaryDirectory() as temp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(temp) / "run"
        if not (run_dir / "metrics.jsonl").exists():
            relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--no-report", "--set", "weight_sync.keep_every=100",
                    *(QUICK_RUN if args.quick else []))
        steps = sum(1 for _ in (run_dir / "metrics.jsonl").open())
        before = evaluate(f"{run_dir}@1", Path(temp) / "before", args.samples, args.limit)
        after = evaluate(str(run_dir), Path(temp) / "after", args.samples, args.limit)
    k = args.samples
    lines = [f"Countdown held-out tasks: {before['overall']['tasks']} x {k} samples, seed 0; a run of {steps} RL steps.",
             "", f"| policy | version | pass@1 | pass@{k} | mean reward | tokens/sample | tokens/solved | eval wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, summary in (("after the warm-up, before RL", before), (f"after RL ({steps} steps)", after)):
        overall = summary["overall"]
        solved = overall["tokens_per_solved"]
        lines.append(f"| {name} | {summary['spec']['version']} | {overall['pass@1']:.3f} | {overall[f'pass@{k}']:.3f} | "
                     f"{overall['mean_reward']:.3f} | {overall['tokens']:.1f} | {'-' if solved is None else f'{solved:.1f}'} | "
                     f"{summary['wall_s']:.1f} |")
    first, last = before["overall"], after["overall"]
    lines += ["", f"RL took held-out pass@1 from {first['pass@1']:.3f} to {last['pass@1']:.3f} "
              f"({last['pass@1'] / max(first['pass@1'], 1e-9):.1f}x) and pass@{k} from {first[f'pass@{k}']:.3f} to "
              f"{last[f'pass@{k}']:.3f}."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("eval_quickstart", command=command_line(argv), markdown=markdown,
                             data={"steps": steps, "samples": k, "before": before["overall"], "after": after["overall"]},
                             revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
