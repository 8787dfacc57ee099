"""Asynchronous RL against a true synchronous loop: wall clock to the same reward, and throughput.

Pairs of ``relayrl run`` runs, same config and seed, over several seeds:

* ``synchronous``: ``[rollout] synchronous = true``: the fleet generates exactly one batch with the
  trainer's current weights, the trainer trains on it and publishes, the engines apply the new
  weights, and only then does the fleet start the next batch. Nothing generated is thrown away and
  every group is on-policy (its staleness is measured and printed: it must be 0).
* ``asynchronous``: the config as shipped: the engines sample while the trainer steps, groups up to
  ``max_staleness`` versions old are trained on (with the IS correction).

Workloads (``--workload``):

* ``quickstart``: ``examples/quickstart.toml`` (countdown, single-turn, a 1M-parameter model):
  generation and training compete for the same two cores, so asynchrony can only fill idle gaps.
* ``agent``: ``examples/agent.toml`` (multi-turn code search with tools in sandboxes) with every
  tool call taking a log-uniform 50 ms - 2 s longer (``tool_latency_s``: a remote service, a slow
  build), so episode lengths have a long tail: a synchronous batch waits for its slowest episode.

Each run is stopped (Ctrl-C: it writes its checkpoint and exits) as soon as its success rate averaged
over ``--window`` steps reaches ``--target``, or after ``--steps`` steps. Per run: wall time and
steps from the first trainer step to the target (the synchronous loop needs fewer steps, being
on-policy; the question is which gets there first), steps/s, fleet tokens/s, mean staleness, groups
dropped, the success rate at the end; then per seed the ratios synchronous / asynchronous time to target and asynchronous / synchronous
steps/s, with their mean and range over seeds. The two modes of a seed run back to back, in
alternating order, so drift of a shared machine falls on both. A full run writes
``benchmarks/results/async_vs_sync-<workload>.json`` (docs render their table from it).

Usage: ``python benchmarks/async_vs_sync.py [--workload quickstart|agent] [--seeds 0,1,2] [--steps N]
[--target R] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import commit, write_results

ROOT = Path(__file__).resolve().parent.parent
MODES = {"synchronous": ["--set", "rollout.synchronous=true"], "asynchronous": []}
WORKLOADS = {
    "quickstart": {"config": "examples/quickstart.toml", "steps": 800, "target": 0.10, "window": 20, "overrides": []},
    "agent": {"config": "examples/agent.toml", "steps": 150, "target": 0.80, "window": 10,
              "overrides": ["--set", "rollout.environment_options.tool_latency_s=[0.05, 2.0]"]},
}
# Smoke runs (CI): no model learns anything in 3 steps; keep every group so that steps happen at all.
QUICK = {
    "quickstart": ["--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
                   "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
                   "--set", "buffer.admission=['staleness']", "--set", "rollout.engines_in_process=true"],
    "agent": ["--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.demonstrations=8",
              "--set", "rollout.environment_options.tool_latency_s=[0.01, 0.05]",
              "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
              "--set", "buffer.admission=['staleness']", "--set", "rollout.engines_in_process=true"],
}


def run(workload: str, mode: str, seed: int, run_dir: Path, steps: int, quick: bool,
        target: float, window: int, overrides: Sequence[str] = ()) -> list[dict]:
    """One run, stopped (Ctrl-C: its checkpoint is written, it exits 130) once the target is reached;
    ``overrides``: more ``--set`` arguments."""
    spec = WORKLOADS[workload]
    command = [sys.executable, "-m", "relayrl.cli", "run", str(ROOT / spec["config"]), "--run-dir", str(run_dir),
               "--steps", str(steps), "--no-report", "--set", f"run.seed={seed}", *spec["overrides"],
               *MODES[mode], *(QUICK[workload] if quick else []), *overrides]
    metrics = run_dir / "metrics.jsonl"
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 7200
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            records = read_records(metrics)
            if not quick and reached_at(records, target, window) is not None:
                process.send_signal(signal.SIGINT)  # the run stops after its current step
                break
        try:
            process.wait(timeout=max(60.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.returncode not in (0, 130):
            log.seek(0)
            raise SystemExit(f"{mode} run (seed {seed}) failed ({process.returncode}):\n{log.read()[-4000:]}")
    return read_records(metrics)


def read_records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return records


def success(metrics: dict) -> float | None:
    """The grader's reward over every graded rollout (before shaping), else the fleet's mean reward."""
    value = metrics.get("reward/fleet_graded_mean", metrics.get("reward/fleet_mean"))
    return None if value is None else float(value)


def reached_at(records: list[dict], target: float, window: int) -> int | None:
    """The index of the first step whose ``window``-step mean success is at least ``target``."""
    rewards = [success(record["metrics"]) for record in records]
    for index in range(window - 1, len(records)):
        recent = [r for r in rewards[index - window + 1:index + 1] if r is not None]
        if len(recent) == window and sum(recent) / window >= target:
            return index
    return None


def summarise(records: list[dict], target: float, window: int) -> dict[str, float | None]:
    start = records[0]["time"]
    rewards = [success(record["metrics"]) for record in records]
    index = reached_at(records, target, window)
    elapsed = max(records[-1]["time"] - start, 1e-9)
    tail = [r for r in rewards[-window:] if r is not None]
    staleness = [record["metrics"].get("staleness/mean", 0.0) for record in records]
    dropped = sum(value for record in records for name, value in record["metrics"].items()
                  if name.startswith("buffer/dropped/"))
    return {"time_to_target_s": None if index is None else records[index]["time"] - start,
            "steps_to_target": None if index is None else records[index]["step"],
            "steps_per_s": (len(records) - 1) / elapsed,
            "fleet_tokens_per_s": records[-1]["metrics"].get("fleet/tokens_per_s", 0.0),
            "staleness_mean": sum(staleness) / len(staleness), "groups_dropped": dropped,
            "final_success": sum(tail) / len(tail) if tail else 0.0, "wall_s": elapsed}


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.mean(values):.2f}x (range {min(values):.2f}-{max(values):.2f}, {len(values)} seeds)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--steps", type=int, default=None, help="at most this many trainer steps per run (default: per workload)")
    parser.add_argument("--target", type=float, default=None, help="success rate (window mean) to reach")
    parser.add_argument("--window", type=int, default=None, help="steps the success rate is averaged over")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 steps each, one seed, no results file")
    args = parser.parse_args(argv)
    spec = WORKLOADS[args.workload]
    seeds = [0] if args.quick else [int(seed) for seed in args.seeds.split(",")]
    steps = 3 if args.quick else (args.steps or spec["steps"])
    target = spec["target"] if args.target is None else args.target
    window = 1 if args.quick else (args.window or spec["window"])
    revision = commit()  # what ran: the tree may change while the runs take their time
    runs = []
    with tempfile.TemporaryDirectory() as temp:
        for position, seed in enumerate(seeds):
            order = list(MODES) if position % 2 == 0 else list(reversed(MODES))
            for mode in order:
                records = run(args.workload, mode, seed, Path(temp) / f"{mode}-{seed}", steps, args.quick, target,
                              window)
                summary = summarise(records, target, window)
                runs.append({"mode": mode, "seed": seed, **summary})
                print(f"{mode} seed {seed}: done", file=sys.stderr)

    def show(value: float | None, fmt: str) -> str:
        return "not reached" if value is None else format(value, fmt)

    lines = [f"`{args.workload}`: each run stops once its success rate averaged over {window} steps reaches {target} "
             f"(at most {steps} trainer steps)", "",
             "| mode | seed | time to target (s) | steps to target | steps/s | fleet tokens/s | mean staleness | "
             "groups dropped | success at the end | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for item in sorted(runs, key=lambda item: (item["mode"] != "synchronous", item["seed"])):
        lines.append(f"| {item['mode']} | {item['seed']} | {show(item['time_to_target_s'], '.0f')} | "
                     f"{show(item['steps_to_target'], 'd')} | {item['steps_per_s']:.2f} | {item['fleet_tokens_per_s']:.0f} | {item['staleness_mean']:.2f} | "
                     f"{item['groups_dropped']:.0f} | {item['final_success']:.3f} | {item['wall_s']:.0f} |")
    by = {(item["mode"], item["seed"]): item for item in runs}
    throughput = [by["asynchronous", seed]["steps_per_s"] / max(by["synchronous", seed]["steps_per_s"], 1e-9)
                  for seed in seeds]
    to_target = [by["synchronous", seed]["time_to_target_s"] / by["asynchronous", seed]["time_to_target_s"]
                 for seed in seeds if by["synchronous", seed]["time_to_target_s"] and by["asynchronous", seed]["time_to_target_s"]]
    unreached = len(seeds) - len(to_target)
    lines += ["", f"Steps per second, asynchronous / synchronous: **{spread(throughput)}**",
              f"Wall clock to the target, synchronous / asynchronous: **{spread(to_target)}**"
              + (f" ({unreached} seed(s) where a mode did not reach it)" if unreached else "")]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        command = (f"python benchmarks/async_vs_sync.py --workload {args.workload} --seeds {','.join(map(str, seeds))} "
                   f"--steps {steps} --target {target} --window {window}")
        path = write_results(f"async_vs_sync-{args.workload}", command=command, markdown=markdown,
                             data={"runs": runs, "throughput_ratios": throughput, "time_to_target_ratios": to_target},
                             revision=revision)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
