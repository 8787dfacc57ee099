"""An example run as a user starts it, timed and tabulated per tenth: what README and the docs quote.

``--example quickstart`` runs ``relayrl run examples/quickstart.toml``; ``--example agent`` runs
``relayrl run examples/agent.toml``; ``--example moe`` runs ``relayrl run examples/moe.toml``. Once per seed (``--seeds``, the report included, as the README's
command does), then renders the first seed's run from the run's ``metrics.jsonl``:

* quickstart (docs/quickstart.md): wall time from the command to the report, start-up + warm-up,
  RL steps per second; per tenth of the steps the success rate (``reward/fleet_mean``: every graded
  answer since the previous step), token and kept-set entropy, the mismatch KL between the engine's
  logprobs and the trainer's replay, staleness, the share of zero-variance groups; then the fleet's
  tokens/s and grading counters, the trainer's step time and checkpoint blocking, the weight
  versions the engine applied and the deltas' compression.
* agent (docs/agents.md): the report's per-tenth table (the grader's reward, tool calls, parallel
  turns, turns, compactions, tokens, entropy, seconds per tool call) and its length-penalty table
  (budget steps against unconstrained ones).

* kernels (docs/kernels.md): per tenth the grader's reward, the shares of graded answers that were
  correct and correct and faster (beyond the noise floor), the geometric mean speed-up of the
  correct ones, the share that failed to load (the "compiler errors" of NumPy code), submissions
  and turns per episode (the results file also keeps the share of submissions the environment's
  report cache answered without a grading).

* moe (docs/algorithms.md): the quickstart's table with the share of token-layer pairs whose experts
  the fp32 trainer's own routers would have chosen differently from the bf16 engine's (replayed).

With several seeds the headline gives every seed's first and last tenth, the mean change and its range.

Writes ``benchmarks/results/example_run-<example>.json`` (the docs' table) and
``example_run-<example>-headline.json`` (the README's sentence).

``--variant single-turn`` (kernels) runs the same example with one submission per episode and
single-submission demonstrations, the same steps: the seeds' single-turn against multi-turn
comparison. Its table ends with both runs' first and last tenths (the multi-turn run's from
``example_run-kernels.json``).

Usage: ``python benchmarks/example_run.py [--example quickstart|agent|kernels|moe] [--variant NAME] [--seeds 0,1,2] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

from relayrl.cli.report import length_penalty_table, tenths_table

ROOT = Path(__file__).resolve().parent.parent
QUICK = {
    "quickstart": ["--steps", "10", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
                   "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
                   "--set", "buffer.admission=['staleness']"],
    "agent": ["--steps", "10", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.demonstrations=8",
              "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
              "--set", "buffer.admission=['staleness']"],
}
QUICK["moe"] = QUICK["quickstart"]
QUICK["kernels"] = ["--steps", "10", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.demonstrations=4",
                    "--set", "buffer.batch_groups=1", "--set", "rollout.skip_zero_variance=false",
                    "--set", "buffer.admission=['staleness']"]

VARIANTS = {
    "kernels": {"single-turn": ["--set", "rollout.environment_options.max_submissions=1",
                                "--set", "rollout.environment_options.demonstration_styles={fused=0.6, copy=0.4}",
                                "--set", "rollout.harness_options.max_turns=2"]},
}
"""Overrides of an example's config that a ``--variant`` runs (same steps, same seed)."""

QUICKSTART_COLUMNS = [
    ("reward/fleet_mean", "success rate"), ("entropy/token_mean", "entropy (nats/token)"),
    ("entropy/kept_mean", "kept-set entropy"), ("mismatch/kl_k3", "mismatch KL (k3)"),
    ("staleness/mean", "staleness (mean)"), ("fleet/zero_variance_fraction", "zero-variance groups")]
MOE_COLUMNS = [*QUICKSTART_COLUMNS[:4], ("routing/set_differs", "expert sets differing (replayed)"),
               *QUICKSTART_COLUMNS[4:]]


# ------------------------------------------------------------------------------ reading a run
def values(records: list[dict[str, Any]], name: str) -> list[float]:
    return [float(record["metrics"][name]) for record in records if record["metrics"].get(name) is not None]


def mean(records: list[dict[str, Any]], name: str) -> float | None:
    """The mean of metric ``name`` over ``records``; None where none recorded it (an empty cell, not a 0)."""
    found = values(records, name)
    return statistics.fmean(found) if found else None


def tenths(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Ten slices of the steps, as the report's tables cut them."""
    size = len(records) / 10
    return [records[round(i * size):round((i + 1) * size)] for i in range(10)]


def num(value: float | None, spec: str, scale: float = 1.0) -> str:
    """``value * scale`` formatted, or ``n/a`` for a metric the run never recorded (a short run may
    publish no delta, for one)."""
    return "n/a" if value is None else format(value * scale, spec)


def change(first: float | None, last: float | None) -> str:
    """``last`` against ``first`` as "2.0x, +0.43", or ``n/a`` where a tenth recorded no value (a
    quick run's one-step tenth may have graded nothing yet)."""
    if first is None or last is None:
        return "n/a"
    return f"{last / max(first, 1e-9):.1f}x, {last - first:+.2f}"


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60):d} s"


def summarise(records: list[dict[str, Any]], started: float, ended: float) -> dict[str, Any]:
    """The run's totals and its first and last tenths' means of every column the docs quote."""
    slices = tenths(records)
    first, last = slices[0], slices[-1]
    final = records[-1]["metrics"]
    rl_s = records[-1]["time"] - records[0]["time"]
    columns = ["reward/fleet_mean", "reward/fleet_graded_mean", "entropy/token_mean", "fleet/tool_calls_per_trajectory",
               "fleet/parallel_turn_share", "fleet/compacted_share"]
    return {"wall_s": ended - started, "startup_s": records[0]["time"] - started, "rl_s": rl_s,
            "steps": len(records), "steps_per_s": (len(records) - 1) / max(rl_s, 1e-9),
            "first_tenth": {name: mean(first, name) for name in columns},
            "last_tenth": {name: mean(last, name) for name in columns},
            "compacted_share_by_tenth": [mean(chunk, "fleet/compacted_share") for chunk in slices],
            "fleet_tokens_per_s": mean(records, "fleet/tokens_per_s"),
            "groups_graded": int(final.get("fleet/groups_graded_total", 0)),
            "answers_graded": int(final.get("sandbox/graded_answers", 0)),
            "sandbox_calls": int(final.get("sandbox/calls", 0)),
            "trainer_step_s": mean(records, "trainer/wall_step_s"),
            "checkpoint_blocking_s": mean(records, "checkpoint/blocking_s"),
            "engine_weight_updates": int(final.get("fleet/engine_weight_updates", 0)),
            "delta_ratio": mean(records, "weight_sync/delta_ratio")}


# ------------------------------------------------------------------------------ what the docs show
def quickstart_markdown(records: list[dict[str, Any]], s: dict[str, Any], columns: list[tuple[str, str]] = QUICKSTART_COLUMNS
                        ) -> tuple[str, str]:
    def cell(value: float | None, name: str) -> str:
        if value is None:
            return ""
        if name == "fleet/zero_variance_fraction":
            return f"{100 * value:.0f}%"
        return f"{value:.4f}" if name in ("mismatch/kl_k3", "routing/set_differs") else f"{value:.3f}"

    lines = [f"Wall time **{minutes(s['wall_s'])}** from the command to the report: {s['startup_s']:.0f} s start-up "
             f"and warm-up, then {s['steps']} RL steps in {s['rl_s']:.0f} s ({s['steps_per_s']:.1f} steps/s).", "",
             "| steps | " + " | ".join(label for _, label in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for chunk in tenths(records):
        lines.append(f"| {chunk[0]['step']}-{chunk[-1]['step']} | "
                     + " | ".join(cell(mean(chunk, name), name) for name, _ in columns) + " |")
    first, last = s["first_tenth"]["reward/fleet_mean"], s["last_tenth"]["reward/fleet_mean"]
    ratio, delta = change(first, last).split(", ") if first is not None and last is not None else ("n/a", "n/a")
    lines += ["", f"The success rate of the last tenth is **{ratio}** that of the first ({delta} absolute); entropy {num(s['first_tenth']['entropy/token_mean'], '.2f')} -> "
              f"{num(s['last_tenth']['entropy/token_mean'], '.2f')} nats/token. Fleet: {num(s['fleet_tokens_per_s'], ',.0f')} tokens/s, "
              f"{s['groups_graded']:,} groups graded ({s['answers_graded']:,} answers in {s['sandbox_calls']:,} sandbox "
              f"commands). Trainer: {num(s['trainer_step_s'], '.2f')} s per step, of which the checkpoint blocked "
              f"{num(s['checkpoint_blocking_s'], '.0f', 1000)} ms; the engine applied {s['engine_weight_updates']} "
              f"weight versions in place; deltas {num(s['delta_ratio'], '.2f')}x smaller than the full weights."]
    headline = (f"Measured here: {minutes(s['wall_s'])} from the command to the report, the success rate "
                f"{num(first, '.3f')} in the first tenth of {s['steps']} steps and {num(last, '.3f')} in the last.")
    return "\n".join(lines), headline


def agent_markdown(records: list[dict[str, Any]], s: dict[str, Any]) -> tuple[str, str]:
    first, last = s["first_tenth"], s["last_tenth"]
    reward = "reward/fleet_graded_mean"
    compacted = [share for share in s["compacted_share_by_tenth"] if share is not None] or [0.0]
    lines = [f"{minutes(s['wall_s'])} from the command to the written report, of which {minutes(s['rl_s'])} are the "
             f"{s['steps']} RL steps and the rest start-up, the demonstrations and the warm-up. Every column is a mean "
             "over every graded trajectory of those steps (trained on or not); the reward is the grader's, before "
             "the length penalty:", "", *tenths_table(records), "",
             f"The grader's reward went from {num(first[reward], '.3f')} in the first tenth to {num(last[reward], '.3f')} "
             f"in the last ({change(first[reward], last[reward])}); tool calls per trajectory from "
             f"{num(first['fleet/tool_calls_per_trajectory'], '.2f')} to {num(last['fleet/tool_calls_per_trajectory'], '.2f')}; "
             f"the share of turns with parallel calls from {num(first['fleet/parallel_turn_share'], '.2f')} to "
             f"{num(last['fleet/parallel_turn_share'], '.2f')}; in every tenth {100 * min(compacted):.0f}% to "
             f"{100 * max(compacted):.0f}% of the trajectories compacted, continued from their summary and were "
             "trained on."]
    penalty = length_penalty_table(records)
    if penalty:
        lines += ["", "The length penalty's phases (budget steps against unconstrained ones):", "", *penalty]
    headline = (f"RL on the grader's reward took one run here ({minutes(s['wall_s'])} in all) from "
                f"{num(first[reward], '.2f')} to {num(last[reward], '.2f')} between the first and the last tenth of "
                f"{s['steps']} steps, with tool calls per trajectory going from "
                f"{num(first['fleet/tool_calls_per_trajectory'], '.1f')} to {num(last['fleet/tool_calls_per_trajectory'], '.1f')} "
                f"and the share of turns with parallel calls from {num(first['fleet/parallel_turn_share'], '.2f')} to "
                f"{num(last['fleet/parallel_turn_share'], '.2f')}.")
    return "\n".join(lines), headline


def counter_deltas(chunk: list[dict[str, Any]], before: dict[str, Any] | None, names: list[str]) -> dict[str, float]:
    """How much each cumulative counter grew over ``chunk`` (from the record ``before`` it, or from 0)."""
    last = chunk[-1]["metrics"]
    earlier = before["metrics"] if before else {}
    return {name: float(last.get(name, 0.0)) - float(earlier.get(name, 0.0)) for name in names}


KERNEL_COUNTERS = ["kernels/graded", "kernels/correct", "kernels/log_speedup_sum", "kernels/faster", "kernels/load_errors",
                   "kernels/no_submission", "kernels/submissions", "kernels/gradings"]


def kernel_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tenth: the grader's reward and the kernel counters' rates over the answers graded in it."""
    rows, before = [], None
    for chunk in tenths(records):
        grew = counter_deltas(chunk, before, KERNEL_COUNTERS)
        graded, correct = max(grew["kernels/graded"], 1.0), grew["kernels/correct"]
        rows.append({"steps": f"{chunk[0]['step']}-{chunk[-1]['step']}",
                     "reward": mean(chunk, "reward/fleet_graded_mean"),
                     "correct": grew["kernels/correct"] / graded,
                     "faster": grew["kernels/faster"] / graded,
                     # geometric: a chain with a power is ~10x faster rewritten and would swamp a mean
                     "speedup": math.exp(grew["kernels/log_speedup_sum"] / correct) if correct else None,
                     "load_errors": grew["kernels/load_errors"] / graded,
                     "no_submission": grew["kernels/no_submission"] / graded,
                     "submissions": mean(chunk, "fleet/tool_calls_per_trajectory"),
                     "turns": mean(chunk, "fleet/turns_per_trajectory"),
                     "graded": int(grew["kernels/graded"]),
                     "saved": 1.0 - grew["kernels/gradings"] / max(grew["kernels/submissions"], 1.0),
                     "entropy": mean(chunk, "entropy/token_mean")})
        before = chunk[-1]
    return rows


def kernels_markdown(records: list[dict[str, Any]], s: dict[str, Any]) -> tuple[str, str]:
    rows = kernel_rows(records)
    s["kernel_rows"] = rows
    lines = [f"{minutes(s['wall_s'])} from the command to the written report, of which {minutes(s['rl_s'])} are the "
             f"{s['steps']} RL steps and the rest start-up, the demonstrations and the warm-up. Per tenth of the steps, "
             "over every answer graded in it (trained on or not):", "",
             "| steps | reward (grader) | correct | faster | speed-up of correct (geometric mean) | load errors | "
             "no answer | submissions | turns | answers graded | entropy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['steps']} | {num(row['reward'], '.3f')} | {100 * row['correct']:.0f}% | "
                     f"{100 * row['faster']:.0f}% | "
                     f"{num(row['speedup'], '.2f')}x | {100 * row['load_errors']:.0f}% | {100 * row['no_submission']:.0f}% | "
                     f"{num(row['submissions'], '.2f')} | {num(row['turns'], '.2f')} | {row['graded']} | "
                     f"{num(row['entropy'], '.3f')} |")
    first, last = rows[0], rows[-1]
    gain = change(first["reward"], last["reward"])
    lines += ["", f"The grader's reward went from {num(first['reward'], '.3f')} in the first tenth to "
              f"{num(last['reward'], '.3f')} in the last ({gain}); the share of correct answers from "
              f"{100 * first['correct']:.0f}% to {100 * last['correct']:.0f}%, of correct and faster ones (beyond the "
              f"noise floor) from {100 * first['faster']:.0f}% to {100 * last['faster']:.0f}%, the geometric mean "
              f"speed-up of the correct from {num(first['speedup'], '.2f')}x to {num(last['speedup'], '.2f')}x."]
    headline = (f"RL on the grader's reward took one run here ({minutes(s['wall_s'])} in all) from "
                f"{num(first['reward'], '.2f')} to {num(last['reward'], '.2f')} between the first and the last tenth "
                f"of {s['steps']} steps; correct answers {100 * first['correct']:.0f}% -> {100 * last['correct']:.0f}%.")
    return "\n".join(lines), headline


def compare_with_base(example: str, variant: str, summary: dict[str, Any]) -> str:
    """The variant's first and last tenths next to the example's own run (its results file)."""
    base_file = ROOT / "benchmarks" / "results" / f"example_run-{example}.json"
    if example != "kernels" or not base_file.exists():
        return f"(no results file of the example itself, {base_file.name}, to compare with)"
    base = json.loads(base_file.read_text())
    base_rows = base["data"]["summary"]["kernel_rows"]
    lines = ["| run | reward, first tenth | reward, last tenth | correct, first | correct, last | "
             "speed-up of correct, last | submissions, last |", "|---|---|---|---|---|---|---|"]
    for label, rows in ((f"multi-turn (example_run-{example}.json, {str(base.get('commit', ''))[:12]})", base_rows),
                        (variant, summary["kernel_rows"])):
        first, last = rows[0], rows[-1]
        lines.append(f"| {label} | {num(first['reward'], '.3f')} | {num(last['reward'], '.3f')} | {100 * first['correct']:.0f}% | "
                     f"{100 * last['correct']:.0f}% | {num(last['speedup'], '.2f')}x | {num(last['submissions'], '.2f')} |")
    return "\n".join(lines)


def moe_markdown(records: list[dict[str, Any]], s: dict[str, Any]) -> tuple[str, str]:
    return quickstart_markdown(records, s, MOE_COLUMNS)


RENDER = {"quickstart": quickstart_markdown, "agent": agent_markdown, "kernels": kernels_markdown, "moe": moe_markdown}


HEADLINE_REWARD = {"quickstart": "reward/fleet_mean", "moe": "reward/fleet_mean",
                   "agent": "reward/fleet_graded_mean", "kernels": "reward/fleet_graded_mean"}
"""The reward a headline over seeds quotes: the success rate, or the grader's reward before shaping."""


def headline_over_seeds(example: str, seeds: list[int], summaries: list[dict[str, Any]]) -> str:
    """The README's sentence from several runs: every seed's first and last tenth, the mean change and
    its range, the wall clock's range; a run whose reward went down is shown like any other."""
    name = HEADLINE_REWARD[example]
    what = "the success rate" if name == "reward/fleet_mean" else "the grader's reward"
    runs, changes = [], []
    for seed, summary in zip(seeds, summaries):
        first, last = summary["first_tenth"][name], summary["last_tenth"][name]
        runs.append(f"{num(first, '.2f')} -> {num(last, '.2f')} (seed {seed})")
        if first is not None and last is not None:
            changes.append(last - first)
    walls = [summary["wall_s"] for summary in summaries]
    steps = summaries[0]["steps"]
    sentence = (f"Measured here on {len(seeds)} seeds, runs of {minutes(min(walls))} to {minutes(max(walls))} from the "
                f"command to the report: {what} from the first to the last tenth of {steps} steps went "
                f"{', '.join(runs)}")
    if changes:
        sentence += (f"; mean change {statistics.fmean(changes):+.2f} (range {min(changes):+.2f} to "
                     f"{max(changes):+.2f})")
    return sentence + "."


def run_example(example: str, seed: int, overrides: list[str], quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One ``relayrl run`` of the example as a user starts it (the report included); its records and summary."""
    with tempfile.TemporaryDirectory(prefix=f"relayrl-{example}-") as folder:
        run_dir = Path(folder) / "run"
        command = [sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples" / f"{example}.toml"),
                   "--run-dir", str(run_dir), "--set", f"run.seed={seed}", *overrides, *(QUICK[example] if quick else [])]
        started = time.time()
        result = subprocess.run(command, capture_output=True, text=True, timeout=7200)
        ended = time.time()
        if result.returncode != 0:
            raise SystemExit(f"the {example} run (seed {seed}) failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if len(records) < 10:
        raise SystemExit(f"seed {seed}: only {len(records)} steps recorded: a table of tenths needs 10")
    return records, summarise(records, started, ended)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(RENDER), default="quickstart")
    parser.add_argument("--variant", default=None, help="a variant of the example (VARIANTS), e.g. single-turn")
    parser.add_argument("--seeds", default="0", help="comma-separated; the table is the first seed's run, the "
                                                       "headline covers every seed")
    parser.add_argument("--quick", action="store_true", help="10 steps, a short warm-up, no results file")
    args = parser.parse_args(argv)
    variants = VARIANTS.get(args.example, {})
    if args.variant is not None and args.variant not in variants:
        parser.error(f"--variant: {args.example} has {sorted(variants) or 'none'}, not {args.variant!r}")
    overrides = variants.get(args.variant, []) if args.variant else []
    name = f"example_run-{args.example}" + (f"-{args.variant}" if args.variant else "")
    revision = commit()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    runs = [run_example(args.example, seed, overrides, args.quick) for seed in seeds]
    records, summary = runs[0]
    markdown, headline = RENDER[args.example](records, summary)
    if len(seeds) > 1:
        markdown = f"The run of seed {seeds[0]}:\n\n{markdown}"
        headline = headline_over_seeds(args.example, seeds, [summary for _, summary in runs])
    if args.variant:
        markdown += "\n\n" + compare_with_base(args.example, args.variant, summary)
    print(markdown)
    print()
    print(headline)
    if not args.quick:
        data = {"seeds": seeds, "summaries": [summary for _, summary in runs], "seed": seeds[0], "summary": summary}
        for results_name, text in ((name, markdown), (f"{name}-headline", headline)):
            path = write_results(results_name, command=command_line(argv), markdown=text, data=data, revision=revision)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
