"""Does RL on the kernels example raise the reward on held-out tasks, and does multi-turn training beat single-turn?

The example's per-tenth table (``example_run.py --example kernels``) moves with the mix of tasks each
tenth happens to draw, and one run of it says little about another. This benchmark measures the
policy instead: for every seed and variant it runs ``relayrl run examples/kernels.toml`` (keeping
version 1, the warmed model RL starts from, on the weight bus), then evaluates version 1 and the
newest version with ``relayrl eval`` on the same held-out chains (a stream the training tasks never
draw from), with the same samples per chain and the same eval seed, so that the two evaluations
differ only in the weights. Every evaluation uses the example's multi-turn episode (up to three
submissions with the grader's feedback between them), whichever episode the run trained on.

Variants: ``multi-turn`` (the example as it ships); ``single-turn-same-start`` (one submission per
episode, the same steps, groups and seed, RL from the multi-turn run's version 1 of the same seed:
the same start, so that the two differ in the RL episode only); ``single-turn`` (``example_run.py``'s
variant: one submission per episode after a warm-up of its own on single-submission
demonstrations, so a different start). The seeds' claim is that multi-turn training beats
single-turn on the same budget.

Per run it records the held-out mean reward, the shares of samples that were correct and correct
and faster (beyond the grader's noise floor), submissions per episode, and the change in mean reward
from version 1 with its standard error over held-out chains (paired: the same chain and sample
seeds before and after). Per variant: the mean change over seeds (with the seeds' errors pooled)
and how many seeds rose beyond two standard errors; per seed, multi-turn minus each single-turn. The
results file is written after every run, and ``--resume`` keeps the runs an earlier invocation
recorded (each with its own commit), so a long measurement can be spread over several sittings.

Usage: ``python benchmarks/kernels_learning.py [--seeds N] [--variants V,...] [--work-dir DIR]
[--eval-tasks N] [--samples N] [--resume] [--tabulate] [--quick]``. A run and its two evaluations
take about half an hour on 2 cores (the same-start variant, without a warm-up, a little less).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from example_run import QUICK as EXAMPLE_QUICK
from example_run import VARIANTS as EXAMPLE_VARIANTS
from example_run import kernel_rows
from results import RESULTS, command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kernels.toml"
NAME = "kernels_learning"
SINGLE_TURN_EPISODE = ["--set", "rollout.environment_options.max_submissions=1", "--set", "rollout.harness_options.max_turns=2"]
VARIANTS: dict[str, list[str]] = {
    "multi-turn": [],
    # One submission per episode, RL from the multi-turn run's version 1 (same seed): the same start.
    "single-turn-same-start": [*SINGLE_TURN_EPISODE, "--set", "trainer.warmup.steps=0", "--set", "model.init={}",
                               "--set", "model.tokenizer=auto"],
    # example_run.py's variant: one submission per episode after a warm-up of its own on
    # single-submission demonstrations (a different start: see the docs).
    "single-turn": EXAMPLE_VARIANTS["kernels"]["single-turn"],
}
SAME_START = "single-turn-same-start"
# The evaluation's episode: the example's multi-turn one, whatever the run trained on.
EVAL_EPISODE = ["--set", "rollout.environment_options.max_submissions=3", "--set", "rollout.harness_options.max_turns=4"]
# The reward of a correct candidate that is not faster (examples/kernels.toml leaves the default).
CORRECT_REWARD = 0.3


def relayrl(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "relayrl.cli", *args], capture_output=True, text=True, timeout=7200)
    if result.returncode != 0:
        raise SystemExit(f"relayrl {args[0]} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def evaluate(model: str, out: Path, tasks: int, samples: int) -> list[dict[str, Any]]:
    """``relayrl eval`` of ``model`` on ``tasks`` held-out chains x ``samples``: its per-sample records."""
    relayrl("eval", model, "--tasks", "kernels", "--split", "eval", "--samples", str(samples), "--k", "1",
            "--pass-threshold", str(CORRECT_REWARD), "--seed", "0", "--out", str(out),
            "--set", f"rollout.environment_options.eval_tasks={tasks}", *EVAL_EPISODE)
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def describe(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Mean reward and the shares of correct and faster samples (a flagged sample counts as neither)."""
    def share(test: Any) -> float:
        return sum(1 for sample in samples if not sample["flags"] and test(sample["reward"])) / len(samples)
    return {"reward": statistics.fmean(sample["reward"] for sample in samples),
            "correct": share(lambda reward: reward >= CORRECT_REWARD - 1e-9),
            "faster": share(lambda reward: reward > CORRECT_REWARD + 1e-9),
            "submissions": statistics.fmean(sample["tool_calls"] for sample in samples),
            "flagged": sum(1 for sample in samples if sample["flags"]) / len(samples),
            "samples": len(samples)}


def paired_change(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean reward change (after - before) and its standard error over held-out chains.

    Samples are paired by (chain, sample): the same chain and engine seed under both versions. The
    chain is the unit of the error (its samples share the chain's difficulty).
    """
    earlier = {(sample["task_id"], sample["sample"]): sample["reward"] for sample in before}
    per_chain: dict[str, list[float]] = {}
    for sample in after:
        key = (sample["task_id"], sample["sample"])
        if key in earlier:
            per_chain.setdefault(sample["task_id"], []).append(sample["reward"] - earlier[key])
    changes = [statistics.fmean(values) for values in per_chain.values()]
    if not changes:
        return math.nan, math.nan
    error = statistics.stdev(changes) / math.sqrt(len(changes)) if len(changes) > 1 else math.nan
    return statistics.fmean(changes), error


def start_model(folder: Path, seed: int) -> Path:
    """The multi-turn run's version 1 of ``seed`` (as its evaluation rebuilt it): where the same-start variant begins."""
    model = folder / f"multi-turn-{seed}-before" / "model-v1"
    if not (model / "config.json").is_file():
        raise SystemExit(f"{SAME_START} seed {seed} starts from the multi-turn run of the same seed, whose version 1 "
                         f"is not in {folder} (run multi-turn seed {seed} with this --work-dir first)")
    return model


def one_run(variant: str, seed: int, args: argparse.Namespace, folder: Path, revision: str) -> dict[str, Any]:
    """Train one run, evaluate version 1 and the newest version; what the results file keeps of it
    (``revision``: the commit the benchmark started on)."""
    run_dir = folder / f"{variant}-{seed}"
    start = ["--set", f"model.path={start_model(folder, seed)}"] if variant == SAME_START else []
    started = time.time()
    relayrl("run", str(EXAMPLE), "--run-dir", str(run_dir), "--no-report", "--set", f"run.seed={seed}",
            "--set", "weight_sync.keep_every=1000", *([*EXAMPLE_QUICK["kernels"], "--steps", "4"] if args.quick else []),
            *VARIANTS[variant], *start)  # the variant's settings last: they win over the smoke run's
    trained = time.time()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = evaluate(f"{run_dir}@1", folder / f"{variant}-{seed}-before", args.eval_tasks, args.samples)
    after = evaluate(str(run_dir), folder / f"{variant}-{seed}-after", args.eval_tasks, args.samples)
    change, error = paired_change(before, after)
    rows = kernel_rows(records) if len(records) >= 10 else []
    return {"variant": variant, "seed": seed, "steps": len(records), "commit": revision,
            "version_after": max(version for sample in after for version in sample["versions"] or [0]),
            "before": describe(before), "after": describe(after), "change": change, "change_error": error,
            "training_first_tenth": rows[0]["reward"] if rows else None,
            "training_last_tenth": rows[-1]["reward"] if rows else None,
            "train_s": trained - started, "eval_s": time.time() - trained}


def markdown(runs: list[dict[str, Any]], tasks: int, samples: int, revision: str) -> str:
    lines = [f"Held-out chains: {tasks}, {samples} samples each, every policy evaluated in the multi-turn episode "
             "(up to 3 submissions); version 1 is the warmed model RL starts from.", "",
             "| variant | seed | steps | reward, v1 | reward, after RL | change (± s.e.) | correct, v1 -> after | "
             "faster, v1 -> after | submissions, after | training reward, first -> last tenth |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        b, a = run["before"], run["after"]
        training = ("-" if run["training_first_tenth"] is None
                    else f"{run['training_first_tenth']:.3f} -> {run['training_last_tenth']:.3f}")
        lines.append(f"| {run['variant']} | {run['seed']} | {run['steps']} | {b['reward']:.3f} | {a['reward']:.3f} | "
                     f"{run['change']:+.3f} ± {run['change_error']:.3f} | {100 * b['correct']:.0f}% -> "
                     f"{100 * a['correct']:.0f}% | {100 * b['faster']:.0f}% -> {100 * a['faster']:.0f}% | "
                     f"{a['submissions']:.2f} | {training} |")
    lines.append("")
    for variant in VARIANTS:
        mine = [run for run in runs if run["variant"] == variant]
        if not mine:
            continue
        changes = [run["change"] for run in mine]
        rose = sum(1 for run in mine if run["change"] > 2 * run["change_error"])
        fell = sum(1 for run in mine if run["change"] < -2 * run["change_error"])
        # The seeds' evaluations are independent: the error of their mean change pools theirs.
        pooled = math.sqrt(sum(run["change_error"] ** 2 for run in mine)) / len(mine)
        lines.append(f"- {variant}: held-out reward {statistics.fmean(run['before']['reward'] for run in mine):.3f} -> "
                     f"{statistics.fmean(run['after']['reward'] for run in mine):.3f} (mean over {len(mine)} seed"
                     f"{'s' if len(mine) > 1 else ''}; mean change {statistics.fmean(changes):+.3f} ± {pooled:.3f}); "
                     f"beyond two standard errors: {rose} rose, {fell} fell, {len(mine) - rose - fell} within.")
    after = {(run["variant"], run["seed"]): run["after"]["reward"] for run in runs}
    for single in (SAME_START, "single-turn"):
        both = sorted(seed for variant, seed in after if variant == "multi-turn" and (single, seed) in after)
        if both:
            gaps = [after[("multi-turn", seed)] - after[(single, seed)] for seed in both]
            # Over seeds: the spread of the gaps holds both the seeds' variation and the evaluations' noise.
            mean = (f"; mean {statistics.fmean(gaps):+.3f} ± {statistics.stdev(gaps) / math.sqrt(len(gaps)):.3f} "
                    f"(standard error over seeds)" if len(gaps) > 1 else "")
            lines.append(f"- Multi-turn minus {single} training, held-out reward after RL, per seed "
                         f"({', '.join(map(str, both))}): {', '.join(f'{gap:+.3f}' for gap in gaps)}{mean}.")
    if {run["commit"] for run in runs} != {revision}:
        commits = ", ".join(f"{run['variant']} seed {run['seed']} at {run['commit'][:12]}" for run in runs)
        lines.append(f"- Runs of more than one sitting: {commits}.")
    minutes = statistics.fmean((run["train_s"] + run["eval_s"]) / 60 for run in runs)
    lines.append(f"- A run and its two evaluations took {minutes:.0f} minutes on average here.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default=f"multi-turn,{SAME_START}",
                        help=f"comma-separated, of {', '.join(VARIANTS)} ({SAME_START} needs multi-turn of its "
                             "seed run first, in the same --work-dir)")
    parser.add_argument("--work-dir", default=None,
                        help="keep the runs and evaluations here (default: a temporary directory, removed at the end); "
                             f"a --resume of {SAME_START} needs the one its multi-turn runs used")
    parser.add_argument("--eval-tasks", type=int, default=48, help="held-out chains")
    parser.add_argument("--samples", type=int, default=2, help="samples per held-out chain")
    parser.add_argument("--resume", action="store_true", help="keep the runs the results file already holds")
    parser.add_argument("--tabulate", action="store_true",
                        help="run nothing: the table again from the results file's runs (implies --resume)")
    parser.add_argument("--quick", action="store_true", help="4 steps, one seed, 4 chains x 1 sample, nothing written")
    args = parser.parse_args(argv)
    variants = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    variants.sort(key=list(VARIANTS).index)  # multi-turn first: the same-start variant begins from its run
    if args.quick:
        args.seeds, args.eval_tasks, args.samples = 1, 4, 1
    revision = commit()
    runs: list[dict[str, Any]] = []
    path = RESULTS / f"{NAME}.json"
    if args.tabulate and not path.exists():
        parser.error(f"--tabulate: no {path.name} to tabulate")
    if (args.resume or args.tabulate) and path.exists():
        data = json.loads(path.read_text())["data"]
        if (data["eval_tasks"], data["samples"]) != (args.eval_tasks, args.samples):
            parser.error(f"--resume: {path.name} evaluated {data['eval_tasks']} x {data['samples']}, "
                         f"not {args.eval_tasks} x {args.samples}")
        runs = data["runs"]
    done = {(run["variant"], run["seed"]) for run in runs}
    # Seed-major, so that an interrupted measurement holds whole pairs of variants.
    todo = [(variant, seed) for seed in range(args.seeds) for variant in variants
            if (variant, seed) not in done and not args.tabulate]
    def report() -> None:
        runs.sort(key=lambda run: (run["seed"], list(VARIANTS).index(run["variant"])))
        text = markdown(runs, args.eval_tasks, args.samples, revision)
        print(text, flush=True)
        if not args.quick:
            written = write_results(NAME, command=command_line(argv), markdown=text,
                                    data={"eval_tasks": args.eval_tasks, "samples": args.samples, "runs": runs},
                                    revision=revision)
            print(f"wrote {written}", flush=True)

    with contextlib.ExitStack() as stack:
        folder = (Path(args.work_dir) if args.work_dir
                  else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relayrl-kernels-learning-"))))
        for variant, seed in todo:
            print(f"{variant}, seed {seed}: training and evaluating ...", flush=True)
            if (folder / f"{variant}-{seed}").exists():  # an interrupted attempt: start it again
                shutil.rmtree(folder / f"{variant}-{seed}")
                for side in ("before", "after"):
                    shutil.rmtree(folder / f"{variant}-{seed}-{side}", ignore_errors=True)
            runs.append(one_run(variant, seed, args, folder, revision))
            report()
    if not todo and runs:  # nothing (left) to run: the table again, from this commit's code
        report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
