"""relayrl's own overhead: ``relayrl run`` on the quickstart against a hand-written single-process GRPO loop.

Both train the quickstart's model (the same fresh 1M-parameter Llama, the same supervised warm-up
on the same demonstrations) on the same task (countdown-lite) with the same algorithm: groups of 8
at temperature 1 and top-p 0.95, GRPO advantages, kept-set replay, truncated importance sampling
(cap 2), PPO-clip, an entropy bonus of 0.01, Muon at 3e-4 (relayrl-algo's optimiser builder, on both
sides), batches of 8 groups with reward variance.

* ``relayrl``: ``relayrl run examples/quickstart.toml``: the fleet (torch engine behind the HTTP
  protocol, token-recording proxy, rollout manager, answers graded in sandboxes), the trainer
  process, the bus, weight sync, checkpoints; asynchronous, as shipped.
* ``relayrl, engine in process``: the same with ``rollout.engines_in_process = true``: the engine
  runs inside the rollout process (no HTTP between them; its own weight-sync controller).
* ``relayrl, one call per sample``: as shipped but ``rollout.group_calls = false``: every sample is
  its own request and stream (the lever group calls are measured against).
* ``relayrl, synchronous``: ``rollout.synchronous = true``: generation and training alternate, every
  group sampled by the trainer's current weights; compared by steps/s with the hand-written loop,
  which alternates too.
* ``relayrl, colocated``: ``rollout.colocate = true``: one process, the engine on the trainer's own
  parameters (each optimiser step is the update, no weight delta), the rollout manager on a thread;
  the weights reach the bus every 100 steps only. ``relayrl, colocated synchronous``: the same,
  alternating, with ``trainer.threads = 2`` (each phase has both cores, as in the hand-written loop);
  ``..., checkpoint every 20``: and ``trainer.checkpoint_every = 20`` (a crash redoes up to 19 steps
  from the buffer's record; the hand-written loop keeps no checkpoint at all).
* ``hand-written``: what one writes for exactly this toy in one process: sample ``--sampler-batch``
  prompts x 8 at once with transformers' ``generate`` (the kept-set read from the top-p-warped
  scores), grade in-process with the reference scorer, keep the groups with reward variance, and
  take one optimiser step per 8 of them with a hand-written loss (the same formula as relayrl's).
  Sampling and training alternate; both use both cores.

Printed per run: groups graded per second (from the first RL step on), wall clock and steps from
the first RL step to a success rate (``--target``, mean over ``--window`` steps, measured on every
graded answer), the warm-up's time, and then the ratios relayrl / hand-written with their range over
``--seeds``. The sides of a seed run back to back; each seed puts a different side first.
``--profile SECONDS`` instead samples every process of a running quickstart with py-spy.

Usage: ``python benchmarks/overhead.py [--seeds 0,1,2] [--steps 400] [--target 0.10] [--quick]
[--sides 'relayrl, colocated|relayrl, colocated synchronous' --name overhead-quickstart-colocated]``
(``--sides``: a subset, the hand-written loop always runs too; ``--name``: its results file).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_vs_sync import WORKLOADS, reached_at, success
from async_vs_sync import run as relayrl_run
from results import command_line, commit, write_results

from relayrl.algo.optim import OptimizerSection, build_optimizer
from relayrl.core.config import load_config
from relayrl.environments.countdown import CountdownEnvironment, score
from relayrl.rollout.evaluation import split_tasks
from relayrl.rollout.models import load_model, load_tokenizer, make_chat_format, materialize_model
from relayrl.trainer.warmup import supervised_warmup

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "quickstart.toml"


# The sides compared, with the overrides of relayrl's runs: as shipped (the engine is a server process
# that the rollout process streams from over HTTP), and with the engine inside the rollout process.
# Colocated: the weights go to the bus every 100 steps (for relayrl eval), the engine follows every step.
COLOCATED = ["--set", "rollout.colocate=true", "--set", "weight_sync.publish_every_steps=100"]
SIDES: dict[str, list[str]] = {"relayrl": [], "relayrl, engine in process": ["--set", "rollout.engines_in_process=true"],
                               "relayrl, one call per sample": ["--set", "rollout.group_calls=false"],
                               "relayrl, synchronous": ["--set", "rollout.synchronous=true"],
                               "relayrl, colocated": COLOCATED,
                               "relayrl, colocated synchronous": [*COLOCATED, "--set", "rollout.synchronous=true",
                                                                  "--set", "trainer.threads=2"],
                               "relayrl, colocated synchronous, checkpoint every 20": [
                                   *COLOCATED, "--set", "rollout.synchronous=true", "--set", "trainer.threads=2",
                                   "--set", "trainer.checkpoint_every=20"],
                               "hand-written": []}
SYNCHRONOUS_SIDES = ("relayrl, synchronous", "relayrl, colocated synchronous",
                     "relayrl, colocated synchronous, checkpoint every 20")
"""Sides that alternate generation and training as the hand-written loop does: their steps/s compare too."""


# ------------------------------------------------------------------------------ the hand-written loop
class HandWrittenGRPO:
    """Sample, grade, train in one process, for exactly the quickstart's configuration."""

    def __init__(self, config: Any, model_dir: Path, seed: int, sampler_batch: int) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(model_dir)
        self.chat = make_chat_format(config.model, self.tokenizer)
        self.model = load_model(model_dir)
        self.environment = CountdownEnvironment(CountdownEnvironment.Config(**config.rollout.environment_options))
        self.tasks, _ = split_tasks(self.environment)
        self.rng = random.Random(seed)
        self.seed = seed
        self.group_size = config.rollout.group_size
        self.batch_groups = config.buffer.batch_groups
        self.sampler_batch = sampler_batch
        self.end = self.chat.stop_token_ids()[0]
        self.pad = self.tokenizer.pad_token_id
        self.entropy_coef = config.trainer.entropy_coef
        self.optimizer = None

    def warm_up(self) -> float:
        """The quickstart's supervised warm-up (relayrl's own function, as ``relayrl run`` calls it)."""
        started = time.perf_counter()
        examples = [(self.chat.render("user", task.instruction) + self.chat.assistant_prefix(),
                     [*self.tokenizer.encode(self.environment.demonstration(task)), self.end]) for task in self.tasks]
        supervised_warmup(self.model, examples, self.config.trainer.warmup, seed=self.seed, pad_token_id=self.pad)
        self.optimizer, _ = build_optimizer(self.model, OptimizerSection(**{
            field: getattr(self.config.algo.optimizer, field) for field in OptimizerSection.__struct_fields__}))
        return time.perf_counter() - started

    @torch.no_grad()
    def sample(self) -> list[dict[str, Any]]:
        """``sampler_batch`` prompts x group size answers in one ``generate`` call; graded; as groups."""
        sampling = self.config.algo.sampling
        tasks = [self.rng.choice(self.tasks) for _ in range(self.sampler_batch)]
        prompts = [self.chat.render("user", task.instruction) + self.chat.assistant_prefix() for task in tasks]
        width = max(len(prompt) for prompt in prompts)
        rows = [prompt for prompt in prompts for _ in range(self.group_size)]
        input_ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in rows])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        self.model.eval()
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, top_k=0,
                                  top_p=sampling.top_p, temperature=sampling.temperature,
                                  max_new_tokens=self.config.rollout.harness_options["max_tokens"],
                                  eos_token_id=self.end, pad_token_id=self.pad, output_scores=True,
                                  return_dict_in_generate=True)
        generated = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1)                      # [rows, steps, vocab], top-p applied
        logprobs = torch.log_softmax(scores, dim=-1)                 # over the kept-set: -inf elsewhere
        groups = []
        for g, task in enumerate(tasks):
            samples = []
            for row in range(g * self.group_size, (g + 1) * self.group_size):
                tokens = generated[row].tolist()
                length = tokens.index(self.end) + 1 if self.end in tokens else len(tokens)
                answer = self.tokenizer.decode([t for t in tokens[:length] if t != self.end])
                samples.append({"prompt": rows[row], "tokens": tokens[:length],
                                "behaviour": logprobs[row, torch.arange(length), generated[row, :length]],
                                "kept": torch.isfinite(scores[row, :length]),
                                "reward": score(task.metadata["numbers"], task.metadata["target"], answer)})
            groups.append(samples)
        return groups

    def train_step(self, groups: list[list[dict[str, Any]]]) -> None:
        """One optimiser step: the loss relayrl's objective computes for this configuration, written out."""
        self.model.train()
        rows = [sample for group in groups for sample in group]
        width = max(len(s["prompt"]) + len(s["tokens"]) for s in rows)
        input_ids = torch.full((len(rows), width), self.pad)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        targets = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, s in enumerate(rows):
            sequence = s["prompt"] + s["tokens"]
            input_ids[r, :len(sequence)] = torch.tensor(sequence)
            attention[r, :len(sequence)] = 1
            targets[r, len(s["prompt"]):len(sequence)] = True
        kept = torch.cat([s["kept"] for s in rows])                              # [T, vocab]
        behaviour = torch.cat([s["behaviour"] for s in rows])                    # [T]
        rewards = torch.tensor([[s["reward"] for s in group] for group in groups], dtype=torch.float64)
        advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
        shifted = targets[:, 1:]                                                 # positions that predict a target
        per_token = advantages.flatten().float()[:, None].expand(-1, width - 1)[shifted]

        logits = self.model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        target_logits = logits[shifted]
        tokens = input_ids[:, 1:][shifted]
        kept_logits = target_logits.masked_fill(~kept, float("-inf"))
        lp = target_logits.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(kept_logits, dim=1)
        weights = (lp.detach() - behaviour).exp().clamp(max=2.0)                  # truncated IS
        count = shifted.sum()
        loss = -(per_token * weights * (lp - lp.detach()).exp()).sum() / count  # PPO-clip at ratio 1
        log_probs = torch.log_softmax(target_logits, dim=-1)
        loss = loss - self.entropy_coef * -(log_probs.exp() * log_probs).sum() / count
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.trainer.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, steps: int, target: float, window: int, quick: bool) -> list[dict[str, Any]]:
        """RL steps until the target or ``steps``; one record per step, like ``metrics.jsonl``."""
        records: list[dict[str, Any]] = []
        waiting: list[list[dict[str, Any]]] = []
        graded_groups, graded_rewards, success_rate = 0, [], None
        while len(records) < steps:
            for group in self.sample():
                graded_groups += 1
                graded_rewards += [s["reward"] for s in group]
                if quick or len({s["reward"] for s in group}) > 1:
                    waiting.append(group)
            while len(waiting) >= self.batch_groups and len(records) < steps:
                batch, waiting = waiting[:self.batch_groups], waiting[self.batch_groups:]
                self.train_step(batch)
                if graded_rewards:  # answers graded since the last step (a second step in a round reuses it)
                    success_rate, graded_rewards = sum(graded_rewards) / len(graded_rewards), []
                records.append({"time": time.time(), "step": len(records) + 1, "metrics": {
                    "fleet/groups_graded_total": graded_groups, "reward/fleet_graded_mean": success_rate}})
                if not quick and reached_at(records, target, window) is not None:
                    return records
        return records


def hand_written(seed: int, steps: int, target: float, window: int, quick: bool, sampler_batch: int,
                 overrides: list[str]) -> tuple[list[dict[str, Any]], float]:
    config = load_config(CONFIG, overrides=[*overrides, f"run.seed={seed}"])
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="relayrl-overhead-") as folder:
        model_dir = materialize_model(config.model, Path(folder) / "model", alphabet=CountdownEnvironment.alphabet,
                                      seed=seed)
        loop = HandWrittenGRPO(config, model_dir, seed, sampler_batch)
        warmup_s = loop.warm_up()
        return loop.run(steps, target, window, quick), warmup_s


# ------------------------------------------------------------------------------ where relayrl's time goes
def profile(seconds: int, folder: Path, overrides: Sequence[str] = (), *, subprocesses: Sequence[str] = ()) -> dict[str, Any]:
    """py-spy every process of a running quickstart (``overrides``: more ``--set`` arguments) for ``seconds``
    once RL has started; CPU samples per process. ``subprocesses``: name prefixes of the processes whose
    children are sampled too, folded into their row (vLLM's engine core is a child of its engine
    process; the rollout process's children are short-lived sandboxed commands, left out)."""
    import json
    import shutil
    import signal
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    run_dir = folder / "run"
    command = [sys.executable, "-m", "relayrl.cli", "run", str(CONFIG), "--run-dir", str(run_dir), "--steps", "100000",
               "--no-report", *overrides]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            while len(read_lines(run_dir / "metrics.jsonl")) < 5:   # RL has started: warm-up and start-up excluded
                if process.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"the quickstart run ended early:\n{log.read()[-3000:]}")
                time.sleep(0.5)
            children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
            spies = {name: subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200",
                                             "--nonblocking", "--full-filenames",
                                             *(["--subprocesses"] if name.startswith(tuple(subprocesses)) else []),
                                             "--format", "raw", "--output", str(folder / f"{name}.txt")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for name, pid in children.items()}
            failures = {name: spy.communicate()[1].strip().splitlines()[-1:] for name, spy in spies.items()
                        if spy.wait() != 0}
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)
    if failures:
        raise SystemExit(f"py-spy could not sample {failures} (ptrace not permitted? see py-spy's docs)")
    return {name: collapse(folder / f"{name}.txt") for name in children}


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


# What each frame is for, by the module it runs in (first match of the innermost relayrl frame and below).
CATEGORIES = [
    ("checkpoints (torch.save, fault tolerance)", ("torch/serialization.py", "relayrl/fault_tolerance/")),
    ("weight sync", ("relayrl/weight_sync/",)),
    ("model forward/backward (torch)", ("torch/", "transformers/")),
    ("vLLM (scheduler, engine core, output processing)", ("vllm/",)),
    ("Dynamo runtime", ("dynamo/",)),
    ("sandboxed grading (subprocess, bubblewrap)", ("subprocess.py", "batch_grading.py", "relayrl/sandbox/")),
    ("HTTP, sockets and polling (aiohttp, selectors)", ("aiohttp/", "http/", "socket.py", "selectors.py", "ssl.py")),
    ("serialisation (msgspec, json, zstd)", ("msgspec", "json/", "zstandard", "codecs.py", "wire.py")),
    ("bus and object store (files)", ("relayrl/core/store", "relayrl/buffer/", "relayrl/core/bus")),
    ("asyncio event loop", ("asyncio/",)),
]


def category(stack: list[str]) -> str:
    """The category of a sample: the innermost frame whose file matches one (torch wins over its callers)."""
    for frame in reversed(stack):
        for name, patterns in CATEGORIES:
            if any(pattern in frame for pattern in patterns):
                return name
    return "other Python (relayrl and the standard library)"


def collapse(path: Path) -> dict[str, Any]:
    """Samples per category and the 8 heaviest innermost relayrl frames, from py-spy's raw (collapsed) output."""
    from collections import Counter

    categories: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in read_lines(path):
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        stack = stack_text.split(";")
        total += count
        categories[category(stack)] += count
        mine = [frame for frame in stack if "relayrl/" in frame]
        if mine:
            own[mine[-1].split(" (")[0] + " (" + mine[-1].split("relayrl/")[-1]] += count
    return {"samples": total, "categories": dict(categories.most_common()), "relayrl_frames": dict(own.most_common(8))}


def render_profile(profiles: dict[str, dict[str, Any]], seconds: int, overrides: Sequence[str] = ()) -> str:
    """The profile's table: each process's CPU samples by category (categories no process touched left out)."""
    shown = [name for name, _ in CATEGORIES if any(data["categories"].get(name) for data in profiles.values())]
    run = " ".join(["relayrl run examples/quickstart.toml", *overrides])
    lines = [f"CPU samples (py-spy, 200 Hz, {seconds} s once RL had started) of each process of `{run}`, by what the "
             "sampled code does:", "",
             "| process | CPU s sampled | " + " | ".join(shown) + " | other |",
             "|---|---|" + "---|" * (len(shown) + 1)]
    for process, data in profiles.items():
        total = max(data["samples"], 1)
        shares = [data["categories"].get(name, 0) / total for name in shown]
        other = 1 - sum(shares)
        lines.append(f"| {process} | {data['samples'] / 200:.1f} | " + " | ".join(f"{100 * share:.0f}%" for share in shares)
                     + f" | {100 * other:.0f}% |")
    lines += ["", "Heaviest relayrl frames (innermost relayrl function on the stack, share of the process's samples):", ""]
    for process, data in profiles.items():
        total = max(data["samples"], 1)
        frames = ", ".join(f"`{frame}` {100 * count / total:.0f}%" for frame, count in list(data["relayrl_frames"].items())[:5])
        lines.append(f"- {process}: {frames or 'none'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ comparing
def summarise(records: list[dict[str, Any]], target: float, window: int) -> dict[str, float | None]:
    first, last = records[0], records[-1]
    elapsed = max(last["time"] - first["time"], 1e-9)
    groups = last["metrics"]["fleet/groups_graded_total"] - first["metrics"]["fleet/groups_graded_total"]
    index = reached_at(records, target, window)
    rewards = [r for r in (success(record["metrics"]) for record in records[-window:]) if r is not None]
    return {"groups_per_s": groups / elapsed, "steps_per_s": (len(records) - 1) / elapsed,
            "time_to_target_s": None if index is None else records[index]["time"] - first["time"],
            "steps_to_target": None if index is None else records[index]["step"],
            "final_success": sum(rewards) / len(rewards) if rewards else 0.0, "steps": len(records)}


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=400, help="at most this many RL steps per run")
    parser.add_argument("--target", type=float, default=WORKLOADS["quickstart"]["target"])
    parser.add_argument("--window", type=int, default=WORKLOADS["quickstart"]["window"])
    parser.add_argument("--sampler-batch", type=int, default=32,
                        help="prompts per generate call (x 8 samples: the engine's max_batch of 256)")
    parser.add_argument("--quick", action="store_true", help="3 steps each, one seed, no results file")
    parser.add_argument("--sides", default="", metavar="SIDE|SIDE...",
                        help=f"only these sides (separated by |) and the hand-written loop; of: {' | '.join(SIDES)}")
    parser.add_argument("--name", default="overhead-quickstart", help="the results file's name")
    parser.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                        help="instead: py-spy every process of a quickstart run for SECONDS and print where CPU goes")
    args = parser.parse_args(argv)
    revision = commit()
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="relayrl-profile-") as folder:
            profiles = profile(args.profile, Path(folder))
        markdown = render_profile(profiles, args.profile)
        print(markdown)
        path = write_results("overhead-profile", command=command_line(argv),
                             markdown=markdown, data=profiles, revision=revision)
        print(f"wrote {path}")
        return 0
    seeds = [0] if args.quick else [int(seed) for seed in args.seeds.split(",")]
    steps = 3 if args.quick else args.steps
    sampler_batch = 2 if args.quick else args.sampler_batch  # quick: several rounds per step, so rates exist
    quick_overrides = ["trainer.warmup.steps=3", "rollout.environment_options.tasks=500"] if args.quick else []
    # Quick mode's relayrl run already hosts its engine in process (async_vs_sync.QUICK): one relayrl side.
    sides = ["relayrl", "hand-written"] if args.quick else list(SIDES)
    if args.sides:
        chosen = [side.strip() for side in args.sides.split("|")]
        unknown = [side for side in chosen if side not in SIDES]
        if unknown:
            parser.error(f"--sides: unknown {unknown}; sides are {list(SIDES)}")
        sides = [*dict.fromkeys([*chosen, "hand-written"])]
    rows, per_seed = [], []
    for seed in seeds:
        results: dict[str, dict[str, Any]] = {}
        order = sides[seed % len(sides):] + sides[:seed % len(sides)]  # each side goes first in turn
        for side in order:
            started = time.time()
            if side == "hand-written":
                records, warmup_s = hand_written(seed, steps, args.target, args.window, args.quick, sampler_batch,
                                                 quick_overrides)
            else:
                with tempfile.TemporaryDirectory(prefix="relayrl-overhead-run-") as folder:
                    records = relayrl_run("quickstart", "asynchronous", seed, Path(folder) / "run", steps, args.quick,
                                          args.target, args.window, SIDES[side])
                warmup_s = records[0]["time"] - started if records else 0.0   # includes start-up
            summary = summarise(records, args.target, args.window)
            summary["warmup_s"] = warmup_s
            results[side] = summary
            print(f"{side} seed {seed}: {summary['groups_per_s']:.1f} groups/s, {summary['steps']} steps, "
                  f"time to target {fmt(summary['time_to_target_s'])} s", flush=True)
            rows.append([side, seed, fmt(summary["groups_per_s"]), fmt(summary["steps_per_s"], ".2f"),
                         fmt(summary["time_to_target_s"]), fmt(summary["steps_to_target"], ".0f"),
                         fmt(summary["final_success"], ".3f"), fmt(warmup_s)])
        theirs = results["hand-written"]
        per_seed.append({"seed": seed, "results": results, "ratios": {
            side: {"groups": results[side]["groups_per_s"] / max(theirs["groups_per_s"], 1e-9),
                   "steps": results[side]["steps_per_s"] / max(theirs["steps_per_s"], 1e-9),
                   "time": (theirs["time_to_target_s"] / results[side]["time_to_target_s"]
                            if results[side]["time_to_target_s"] and theirs["time_to_target_s"] else None)}
            for side in sides if side != "hand-written"}})
    lines = [f"| side | seed | groups graded/s | steps/s | s to {args.target:g} | steps to {args.target:g} | "
             f"success (last {args.window} steps) | warm-up + start-up s |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    lines.append("")
    for side in (side for side in sides if side != "hand-written"):
        ratios = [entry["ratios"][side]["groups"] for entry in per_seed]
        lines.append(f"{side} / hand-written groups graded per second: {statistics.fmean(ratios):.2f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) over {len(per_seed)} seed(s).")
        if side in SYNCHRONOUS_SIDES:
            steps = [entry["ratios"][side]["steps"] for entry in per_seed]
            lines.append(f"{side} / hand-written steps per second: {statistics.fmean(steps):.2f}x "
                         f"({min(steps):.2f}-{max(steps):.2f}) over {len(per_seed)} seed(s).")
        times = [entry["ratios"][side]["time"] for entry in per_seed if entry["ratios"][side]["time"] is not None]
        if times:
            lines.append(f"Hand-written / {side} wall clock to a {args.target:g} success rate: "
                         f"{statistics.fmean(times):.2f}x ({min(times):.2f}-{max(times):.2f}) over {len(times)} "
                         "seed(s) that both reached it (above 1: relayrl got there first).")
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results(args.name, command=command_line(argv), markdown=markdown,
                             data={"seeds": per_seed, "target": args.target, "window": args.window,
                                   "sampler_batch": args.sampler_batch}, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
