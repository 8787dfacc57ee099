"""Top-p with kept-set replay vs naive top-p vs plain sampling, on the quickstart's task, over seeds.

The SWE-1.7 report's claim: sampling with top-p keeps rollouts on-distribution, but only if the
trainer renormalises over the *same* kept-set ("replay"); a trainer that computes logprobs over the
full vocabulary for top-p samples ("naive") sees a train/inference mismatch that grows as the
distribution sharpens, and plain sampling (top-p 1) lets the tail's negative-advantage tokens push
entropy down. Per seed, every variant starts from the same warmed-up model and gets the same budget:

* ``replay``: top-p 0.95, kept-sets recorded by the engine and replayed by the trainer;
* ``naive``: top-p 0.95, kept-sets dropped before training (the trainer uses the full softmax; the
  engine's logprobs are still those of the truncated distribution, as in a stack without replay);
* ``plain``: top-p 1.0.

``--diagnose`` adds three runs of ``replay`` that each change one suspect of an entropy decline: no
entropy bonus (``replay-no-bonus``), a third of Muon's learning rate (``replay-lr1e-4``: a smaller
update per step) and a tighter kept-set (``replay-p0.8``).

Each step samples 16 prompts x 8 with relayrl's torch engine (in process), scores the answers with
countdown's reference scorer (the sandboxed grader is identical and tested against it; grading is
not what is measured), skips zero-variance groups and takes one TorchTrainer step (GRPO, PPO-clip,
truncated IS, Muon 3e-4, entropy bonus 0.01: the quickstart's settings). A seed changes the model's
initialisation, the warm-up's batches, the task order and the engine's sampling. Printed: entropy of
the full distribution (the one the entropy bonus acts on), entropy of the renormalised kept-set (the
distribution the engine samples), mismatch KL (k3, behaviour vs trainer) and success rate, per tenth
of the run, as the mean over seeds and the range; the slope of the success rate over the last three
tenths says whether the run reached its plateau. Writes ``benchmarks/results/replay_ablation.json``
(``replay_ablation-diagnose.json`` with ``--diagnose``; docs/algorithms.md renders both) and, with
``--plot FILE`` and matplotlib, a plot of the means.

Usage: ``python benchmarks/replay_ablation.py [--steps N] [--seeds 0 1 2] [--diagnose] [--plot FILE]
[--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection
from relayrl.core.arrays import pack_u32
from relayrl.core.wire import Group, Trajectory, TrajectorySegment, Turn
from relayrl.environments.countdown import ALPHABET, make_tasks, score
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.config import ModelSection
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.models import load_model, materialize_model
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.trainer.config import TrainerSection, WarmupSection
from relayrl.trainer.torch_backend import TorchTrainer
from relayrl.trainer.warmup import supervised_warmup


@dataclass(frozen=True)
class Variant:
    """One arm of the ablation: how it samples and how the trainer sees the samples."""

    top_p: float
    replay: bool             # False: kept-sets are dropped before the trainer sees the batch
    entropy_coef: float = 0.01
    lr: float = 3e-4


VARIANTS = {"replay": Variant(0.95, True), "naive": Variant(0.95, False), "plain": Variant(1.0, True)}
DIAGNOSTICS = {"replay-no-bonus": Variant(0.95, True, entropy_coef=0.0), "replay-lr1e-4": Variant(0.95, True, lr=1e-4),
               "replay-p0.8": Variant(0.8, True)}
KEYS = (("entropy", "entropy (nats/token)", ".3f"), ("kept_entropy", "kept-set entropy (what is sampled)", ".3f"),
        ("kl", "mismatch KL (k3)", ".4f"), ("reward", "success rate", ".3f"))
SHOWN_TENTHS = (0, 2, 4, 6, 8, 9)   # the docs table's columns: 1/10, 3/10, ..., 9/10, 10/10


def warmed_model(workdir: Path, warmup_steps: int, seed: int):
    """A fresh 1M-parameter countdown model (initialised with ``seed``) after a supervised warm-up."""
    section = ModelSection(init={"max_position_embeddings": 64}, tokenizer="char", chat_format="raw")
    model = load_model(materialize_model(section, workdir / "model", alphabet=ALPHABET, seed=seed))
    tokenizer = CharTokenizer(ALPHABET)
    chat = RawChatFormat(tokenizer)
    end = chat.stop_token_ids()
    examples = [(chat.render("user", task.instruction), tokenizer.encode(task.answer) + end)
                for task in make_tasks(20000, seed=0)]
    supervised_warmup(model, examples, WarmupSection(steps=warmup_steps), seed=seed)
    return model, chat


async def run_variant(variant: Variant, model, chat, steps: int, prompts: int, group: int, *, seed: int,
                      skip_zero_variance: bool = True) -> list[dict[str, float]]:
    """``steps`` RL steps of ``variant`` from a copy of ``model``; one record per step."""
    torch.manual_seed(1000 + seed)
    policy = copy.deepcopy(model)
    engine = TorchEngine(copy.deepcopy(model).eval(), max_batch=prompts * group, version=1, seed=1 + seed)
    algo = AlgoSection(sampling=SamplingSection(top_p=variant.top_p),
                       optimizer=OptimizerSection(lr=variant.lr, muon=True))
    trainer = TorchTrainer(policy, algo=algo, config=TrainerSection(entropy_coef=variant.entropy_coef), version=1)
    end = chat.stop_token_ids()
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=variant.top_p, stop_token_ids=end)
    tasks = make_tasks(20000, seed=0)
    random.Random(seed).shuffle(tasks)
    history = []
    try:
        for step in range(steps):
            batch = tasks[step * prompts % len(tasks):][:prompts]
            requests = [engine.generate(GenerateRequest(request_id=f"{step}-{g}-{i}", prompt=chat.render("user", task.instruction),
                                                        params=params))
                        for g, task in enumerate(batch) for i in range(group)]
            spans = await asyncio.gather(*requests)
            groups, rewards = [], []
            for g, task in enumerate(batch):
                trajectories = []
                for i in range(group):
                    span = spans[g * group + i]
                    text = chat.decode([token for token in span.token_ids() if token not in end])
                    reward = score(task.metadata["numbers"], task.metadata["target"], text)
                    rewards.append(reward)
                    if not variant.replay:  # a stack without kept-sets: the trainer sees the full vocabulary
                        span = msgspec.structs.replace(span, kept_offsets=b"", kept_ids=b"")
                    turns = [Turn(role="user", tokens=pack_u32(chat.render("user", task.instruction))),
                             Turn(role="assistant", generated=span)]
                    trajectories.append(Trajectory(trajectory_id=f"{step}-{g}-{i}", task_id=task.task_id,
                                                   group_id=f"{step}-{g}", sample_index=i, reward=reward,
                                                   segments=[TrajectorySegment(turns=turns)]))
                if len({t.reward for t in trajectories}) > 1 or not skip_zero_variance:
                    groups.append(Group(group_id=f"{step}-{g}", task_id=task.task_id, trajectories=trajectories))
            record = {"reward": sum(rewards) / len(rewards)}
            if groups:
                metrics = trainer.step(groups)
                record.update(entropy=metrics["entropy/token_mean"], kl=metrics.get("mismatch/kl_k3", 0.0))
                if variant.replay:  # without kept-sets the trainer does not know what the engine sampled from
                    # top-p 1 records no kept-sets: the engine samples the full distribution
                    record["kept_entropy"] = metrics["entropy/kept_mean" if variant.top_p < 1 else "entropy/token_mean"]
                engine.pause()
                engine.load_weights(dict(policy.named_parameters()), trainer.version)
                engine.resume()
            history.append(record)
    finally:
        await engine.close()
    return history


# ------------------------------------------------------------------------------ summaries
def tenths(history: list[dict[str, float]], key: str) -> list[float | None]:
    """Mean of ``key`` over each tenth of the run (None where no step of that tenth recorded it)."""
    size = len(history) / 10
    chunks = [history[round(i * size):round((i + 1) * size)] for i in range(10)]
    values = [[record[key] for record in chunk if key in record] for chunk in chunks]
    return [statistics.fmean(found) if found else None for found in values]


def late_slope(history: list[dict[str, float]]) -> float:
    """Least-squares slope of the success rate over the run's last three tenths, per 100 steps: about 0
    once the run has reached its plateau."""
    tail = history[len(history) * 7 // 10:]
    if len(tail) < 2:
        return 0.0
    xs = range(len(tail))
    return statistics.linear_regression(xs, [record["reward"] for record in tail]).slope * 100


def spread(values: list[float], fmt: str) -> str:
    """``mean (min-max)`` over seeds; the mean alone for one seed."""
    if not values:
        return "-"
    mean = format(statistics.fmean(values), fmt)
    return mean if len(values) == 1 else f"{mean} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def last_ratio(pairs: list[tuple[list[dict[str, float]], list[dict[str, float]]]], key: str) -> list[float]:
    """Per seed, the last tenth's ``key`` of one run over that of the other (seeds where both recorded it)."""
    ratios = []
    for ours, theirs in pairs:
        mine, other = tenths(ours, key)[9], tenths(theirs, key)[9]
        if mine and other:
            ratios.append(mine / other)
    return ratios


def render(runs: dict[str, dict[int, dict]], steps: int, seeds: list[int]) -> str:
    """The docs' table (mean over seeds and range, per shown tenth) and what the runs say."""
    names = list(runs)
    per_tenth = {name: {key: [tenths(run["history"], key) for run in runs[name].values()] for key, _, _ in KEYS}
                 for name in names}

    def column(name: str, key: str, tenth: int) -> list[float]:
        return [values[tenth] for values in per_tenth[name][key] if values[tenth] is not None]

    lines = [f"{len(seeds)} seed(s), {steps} steps of 16 prompts x 8 per run; mean over seeds (min-max):", "",
             "| | " + " | ".join(f"{t + 1}/10" for t in SHOWN_TENTHS) + " |", "|---|" + "---|" * len(SHOWN_TENTHS)]
    for key, title, fmt in KEYS:
        for name in names:
            lines.append(f"| {title.split(' (')[0]}, {name} | "
                         + " | ".join(spread(column(name, key, t), fmt) for t in SHOWN_TENTHS) + " |")
    lines += ["", "| | entropy, last tenth / first | kept-set entropy, last tenth / first | success-rate slope over "
              "the last 3 tenths (per 100 steps) | s per run |", "|---|---|---|---|---|"]

    def kept_share(name: str, key: str) -> list[float]:
        return [last / first for first, last in zip(column(name, key, 0), column(name, key, 9)) if first]

    for name in names:
        slopes = [late_slope(run["history"]) for run in runs[name].values()]
        seconds = [run["seconds"] for run in runs[name].values()]
        lines.append(f"| {name} | {spread(kept_share(name, 'entropy'), '.2f')} | "
                     f"{spread(kept_share(name, 'kept_entropy'), '.2f')} | {spread(slopes, '+.3f')} | "
                     f"{spread(seconds, '.0f')} |")
    lines.append("")
    findings = []
    for other in ("naive", "plain"):
        if other not in runs or "replay" not in runs:
            continue
        pairs = [(runs["replay"][s]["history"], runs[other][s]["history"]) for s in seeds]

        entropy, sampled = last_ratio(pairs, "entropy"), last_ratio(pairs, "kept_entropy")
        reward = [tenths(a, "reward")[9] - tenths(b, "reward")[9] for a, b in pairs]
        findings.append(f"Last tenth, replay against {other}: entropy {spread(entropy, '.2f')}x, higher in "
                        f"{sum(r > 1 for r in entropy)} of {len(entropy)} seeds"
                        + (f"; the entropy of what is sampled {spread(sampled, '.2f')}x, higher in "
                           f"{sum(r > 1 for r in sampled)} of {len(sampled)}" if sampled else "")
                        + f"; success rate {spread(reward, '+.3f')} absolute, higher in "
                          f"{sum(r > 0 for r in reward)} of {len(reward)} seeds.")
    if "naive" in runs:
        kl = [tenths(run["history"], "kl") for run in runs["naive"].values()]
        findings.append(f"Naive top-p's mismatch KL: {spread([k[0] for k in kl if k[0] is not None], '.4f')} in the "
                        f"first tenth, {spread([k[9] for k in kl if k[9] is not None], '.4f')} in the last; replay's is "
                        f"{spread(column('replay', 'kl', 9), '.4f')}." if "replay" in runs else "")
    lines += [finding for finding in findings if finding]
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, dict]], path: str) -> None:
    """Mean over seeds of each variant's 20-step moving average, per metric."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    figure, axes = plt.subplots(1, len(KEYS), figsize=(4.3 * len(KEYS), 3.4))
    for axis, (key, title, _) in zip(axes, KEYS):
        for name, seeds in runs.items():
            curves = []
            for run in seeds.values():
                values = [record.get(key) for record in run["history"]]
                curves.append([statistics.fmean(found) if (found := [v for v in values[max(0, i - 19):i + 1] if v is not None])
                               else float("nan") for i in range(len(values))])
            mean = [statistics.fmean(points) for points in zip(*curves)]
            axis.plot(range(len(mean)), mean, label=name, linewidth=1.0)
        axis.set_title(f"{title}\nmean of {len(next(iter(runs.values())))} seed(s)", fontsize=9)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--diagnose", action="store_true", help="also run the three one-change variants of replay")
    parser.add_argument("--plot", default=None, help="write a PNG here (needs matplotlib)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one seed, tiny warm-up, few steps, no results file")
    args = parser.parse_args(argv)
    steps, warmup, prompts = (6, 5, 4) if args.quick else (args.steps, 70, 16)
    seeds = args.seeds[:1] if args.quick else args.seeds
    variants = {**VARIANTS, **(DIAGNOSTICS if args.diagnose else {})}
    torch.set_num_threads(1 if args.quick else 2)
    revision = commit()

    runs: dict[str, dict[int, dict]] = {name: {} for name in variants}
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="relayrl-ablation-") as temp:
            model, chat = warmed_model(Path(temp), warmup, seed)
        for name, variant in variants.items():
            started = time.perf_counter()
            # The smoke run's model solves nothing yet: train on zero-variance groups so the step runs.
            history = asyncio.run(run_variant(variant, model, chat, steps, prompts, 8, seed=seed,
                                              skip_zero_variance=not args.quick))
            runs[name][seed] = {"history": history, "seconds": time.perf_counter() - started}
            print(f"seed {seed}, {name}: {steps} steps in {runs[name][seed]['seconds']:.0f} s, success rate of the last "
                  f"tenth {tenths(history, 'reward')[9]:.3f}", file=sys.stderr, flush=True)

    for key, title, fmt in KEYS:   # every tenth, for the terminal
        print(f"\n{title}, mean over seeds per tenth of the run")
        print("variant | " + " | ".join(f"{i + 1}/10" for i in range(10)))
        for name in runs:
            per_seed = [tenths(run["history"], key) for run in runs[name].values()]
            print(f"{name} | " + " | ".join(spread([v[t] for v in per_seed if v[t] is not None], fmt).split(" ")[0]
                                            for t in range(10)))
    markdown = render(runs, steps, seeds)
    print("\n" + markdown)
    if args.plot:
        plot(runs, args.plot)
    if not args.quick:
        data = {"steps": steps, "seeds": seeds, "warmup_steps": warmup, "prompts": prompts, "group": 8,
                "variants": {name: asdict(variants[name]) for name in runs},
                "runs": {name: {str(seed): {"seconds": run["seconds"], "late_slope": late_slope(run["history"]),
                                            **{key: tenths(run["history"], key) for key, _, _ in KEYS}}
                                for seed, run in seeds_runs.items()} for name, seeds_runs in runs.items()}}
        name = "replay_ablation-diagnose" if args.diagnose else "replay_ablation"
        path = write_results(name, command=command_line(argv), markdown=markdown, data=data, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
