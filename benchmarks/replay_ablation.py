"""Top-p with kept-set replay vs naive top-p vs plain sampling, on the quickstart's task.

The SWE-1.7 report's claim: sampling with top-p keeps rollouts on-distribution, but only if the
trainer renormalises over the *same* kept-set ("replay"); a trainer that computes logprobs over the
full vocabulary for top-p samples ("naive") sees a train/inference mismatch that grows as the
distribution sharpens, and plain sampling (top-p 1) lets the tail's negative-advantage tokens push
entropy down. Three runs from the same warmed-up model, same seed, same budget:

* ``replay``: top-p 0.95, kept-sets recorded by the engine and replayed by the trainer;
* ``naive``: top-p 0.95, kept-sets dropped before training (the trainer uses the full softmax; the
  engine's logprobs are still those of the truncated distribution, as in a stack without replay);
* ``plain``: top-p 1.0.

Each step samples 16 prompts x 8 with relayrl's torch engine (in process), scores the answers with
countdown's reference scorer (the sandboxed grader is identical and tested against it; grading is
not what is measured), skips zero-variance groups and takes one TorchTrainer step (GRPO, PPO-clip,
truncated IS, Muon 3e-4, entropy bonus 0.01: the quickstart's settings). Printed: entropy of the
full distribution, mismatch KL (k3, behaviour vs trainer) and success rate, per tenth of the run;
with matplotlib, a plot. Usage: ``python benchmarks/replay_ablation.py [--steps N] [--plot FILE] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import sys
import time
from pathlib import Path

import msgspec
import torch

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection
from relayrl.core.arrays import pack_u32
from relayrl.core.wire import Group, Trajectory, TrajectorySegment, Turn
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.config import ModelSection
from relayrl.rollout.countdown import ALPHABET, make_tasks, score
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.models import load_model, materialize_model
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.trainer.config import TrainerSection, WarmupSection
from relayrl.trainer.torch_backend import TorchTrainer
from relayrl.trainer.warmup import supervised_warmup

VARIANTS = {"replay": (0.95, True), "naive": (0.95, False), "plain": (1.0, True)}


def warmed_model(workdir: Path, warmup_steps: int):
    section = ModelSection(init={"max_position_embeddings": 64}, tokenizer="char", chat_format="raw")
    model = load_model(materialize_model(section, workdir / "model", alphabet=ALPHABET, seed=0))
    tokenizer = CharTokenizer(ALPHABET)
    chat = RawChatFormat(tokenizer)
    end = chat.stop_token_ids()
    examples = [(chat.render("user", task.instruction), tokenizer.encode(task.answer) + end)
                for task in make_tasks(20000, seed=0)]
    supervised_warmup(model, examples, WarmupSection(steps=warmup_steps), seed=0)
    return model, chat


async def run_variant(name: str, model, chat, steps: int, prompts: int, group: int, *,
                      skip_zero_variance: bool = True) -> list[dict[str, float]]:
    top_p, replay = VARIANTS[name]
    torch.manual_seed(1)
    policy = copy.deepcopy(model)
    engine = TorchEngine(copy.deepcopy(model).eval(), max_batch=prompts * group, version=1, seed=1)
    algo = AlgoSection(sampling=SamplingSection(top_p=top_p), optimizer=OptimizerSection(lr=3e-4, muon=True))
    trainer = TorchTrainer(policy, algo=algo, config=TrainerSection(entropy_coef=0.01), version=1)
    end = chat.stop_token_ids()
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=top_p, stop_token_ids=end)
    tasks = make_tasks(20000, seed=0)
    random.Random(0).shuffle(tasks)
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
                    if not replay:  # a stack without kept-sets: the trainer sees the full vocabulary
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
                record.update(entropy=metrics["entropy/token_mean"], kl=metrics.get("mismatch/kl_k3", 0.0),
                              ratio_min=metrics.get("is/ratio_min", 1.0))
                engine.pause()
                engine.load_weights(dict(policy.named_parameters()), trainer.version)
                engine.resume()
            history.append(record)
    finally:
        await engine.close()
    return history


def tenths(history: list[dict[str, float]], key: str) -> list[float | None]:
    """Mean of ``key`` over each tenth of the run (None where no step recorded it)."""
    size = max(1, len(history) // 10)
    chunks = [history[i:i + size] for i in range(0, size * 10, size) if history[i:i + size]]
    values = [[r[key] for r in chunk if key in r] for chunk in chunks]
    return [sum(v) / len(v) if v else None for v in values]


def _format(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--plot", default=None, help="write a PNG here (needs matplotlib)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny warm-up, few steps")
    args = parser.parse_args(argv)
    steps, warmup, prompts = (6, 5, 4) if args.quick else (args.steps, 70, 16)
    torch.set_num_threads(2 if not args.quick else 1)
    import tempfile

    with tempfile.TemporaryDirectory() as temp:
        model, chat = warmed_model(Path(temp), warmup)
    results = {}
    for name in VARIANTS:
        started = time.perf_counter()
        # The smoke run's model solves nothing yet: train on zero-variance groups so the step runs.
        results[name] = asyncio.run(run_variant(name, model, chat, steps, prompts, 8, skip_zero_variance=not args.quick))
        print(f"{name}: {steps} steps in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    for key, title, fmt in (("entropy", "entropy (nats/token)", ".3f"), ("kl", "mismatch KL k3", ".4f"),
                            ("reward", "success rate", ".3f")):
        print(f"\n{title}, mean per tenth of the run")
        print("variant | " + " | ".join(f"{i + 1}/10" for i in range(len(tenths(results['replay'], key)))))
        for name, history in results.items():
            print(f"{name} | " + " | ".join(_format(value, fmt) for value in tenths(history, key)))
    last = {name: {key: tenths(history, key)[-1] for key in ("entropy", "kl")} for name, history in results.items()}
    print()
    for name in ("naive", "plain"):
        if last["replay"]["entropy"] and last[name]["entropy"]:
            print(f"last-tenth entropy, replay / {name}: {last['replay']['entropy'] / last[name]['entropy']:.2f}x")
    if last["naive"]["kl"] is not None and last["replay"]["kl"] is not None:
        print(f"last-tenth mismatch KL: naive {last['naive']['kl']:.4f}, replay {last['replay']['kl']:.4f}")

    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot", file=sys.stderr)
            return 0
        figure, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        for axis, (key, title) in zip(axes, (("entropy", "entropy (nats/token)"), ("kl", "mismatch KL (k3)"),
                                              ("reward", "success rate"))):
            for name, history in results.items():
                points = [(i, r[key]) for i, r in enumerate(history) if key in r]
                axis.plot([p[0] for p in points], [p[1] for p in points], label=name, linewidth=1.0)
            axis.set_title(title)
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
        axes[0].legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
