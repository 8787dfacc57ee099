"""Rollout routing replay on a mixture of experts with a low-precision engine, with and without replay.

The setting where routing replay matters (Ma et al., arXiv:2510.11370): a mixture-of-experts policy
whose engine samples in bfloat16 while the trainer trains in float32. Engine and trainer then route
some tokens to different experts; without replay the trainer scores those tokens under a different
function than the one that sampled them. Per seed, both arms start from the same warmed-up model
and get the same budget:

* ``replay``: the engine's recorded routing is forced in the trainer (``[algo] routing_replay``);
* ``no-replay``: the trainer routes with its own routers (the routing is still recorded, to measure
  how often the two sides disagree).

The task and loop are the quickstart's (countdown-lite; a fresh Qwen3-MoE of examples/moe.toml's
shape after a supervised warm-up; 16 prompts x 8 samples per step, top-p 0.95; GRPO, PPO-clip,
truncated IS, Muon 3e-4, entropy bonus 0.01). Each step the engine (relayrl's torch engine, in
process, bfloat16) samples, countdown's reference scorer grades, the trainer (torch backend, float32)
takes one step, and the engine receives the trainer's weights converted to bfloat16 (what a weight
controller applies under ``[rollout] engine_dtype``).

Printed per tenth of the run, mean over seeds (and range): the share of (token, layer) pairs whose
expert set differs between engine and trainer, the mismatch KL (k3) between the engine's recorded
logprobs and the trainer's, the importance-weight spread (mean |log ratio| and the max ratio), the
entropy and the success rate; and the last tenth's ratios replay / no-replay. Writes
``benchmarks/results/routing_replay.json`` (docs/algorithms.md renders it).

Usage: ``python benchmarks/routing_replay.py [--steps N] [--seeds 0 1 2] [--quick]``.
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
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_ablation import spread, tenths  # the kept-set ablation's per-tenth summaries
from results import command_line, commit, write_results

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection
from relayrl.core.arrays import pack_u32
from relayrl.core.wire import Group, Trajectory, TrajectorySegment, Turn
from relayrl.environments.countdown import ALPHABET, make_tasks, score
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.models import load_model, materialize_model
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.trainer.config import TrainerSection, WarmupSection
from relayrl.trainer.torch_backend import TorchTrainer
from relayrl.trainer.warmup import supervised_warmup

ARMS = {"replay": True, "no-replay": False}
KEYS = (("set_differs", "expert sets differing (share of token-layer pairs)", ".4f"),
        ("kl", "mismatch KL (k3)", ".5f"),
        ("abs_log_ratio", "mean absolute log importance ratio", ".4f"),
        ("ratio_max", "largest importance ratio", ".3f"),
        ("entropy", "entropy (nats/token)", ".3f"),
        ("reward", "success rate", ".3f"))
SHOWN_TENTHS = (0, 2, 4, 6, 8, 9)


def moe_section():
    """examples/moe.toml's model."""
    from relayrl.rollout.config import ModelSection

    init = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
            "max_position_embeddings": 64}
    return ModelSection(architecture="qwen3-moe", init=init, tokenizer="char", chat_format="raw")


def warmed_model(workdir: Path, warmup_steps: int, seed: int):
    """A fresh countdown MoE (initialised with ``seed``) after the quickstart's supervised warm-up."""
    model = load_model(materialize_model(moe_section(), workdir / "model", alphabet=ALPHABET, seed=seed))
    tokenizer = CharTokenizer(ALPHABET)
    chat = RawChatFormat(tokenizer)
    end = chat.stop_token_ids()
    examples = [(chat.render("user", task.instruction), tokenizer.encode(task.answer) + end)
                for task in make_tasks(20000, seed=0)]
    supervised_warmup(model, examples, WarmupSection(steps=warmup_steps), seed=seed)
    return model, chat


def engine_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's weights as a bfloat16 engine receives them (converted on publish)."""
    return {name: value.detach().to(torch.bfloat16) for name, value in policy.state_dict().items()}


async def run_arm(replay: bool, model, chat, steps: int, prompts: int, group: int, *, seed: int,
                  skip_zero_variance: bool = True) -> list[dict[str, float]]:
    """``steps`` RL steps from a copy of ``model`` with a bfloat16 engine; one record per step."""
    torch.manual_seed(1000 + seed)
    policy = copy.deepcopy(model)
    engine = TorchEngine(copy.deepcopy(model).to(torch.bfloat16).eval(), max_batch=prompts * group, version=1,
                         seed=1 + seed)
    algo = AlgoSection(sampling=SamplingSection(top_p=0.95), optimizer=OptimizerSection(lr=3e-4, muon=True),
                       routing_replay=replay)
    trainer = TorchTrainer(policy, algo=algo, config=TrainerSection(entropy_coef=0.01), version=1)
    end = chat.stop_token_ids()
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, stop_token_ids=end, routing_from=0)
    tasks = make_tasks(20000, seed=0)
    random.Random(seed).shuffle(tasks)
    history = []
    try:
        for step in range(steps):
            batch = tasks[step * prompts % len(tasks):][:prompts]
            requests = [engine.generate(GenerateRequest(request_id=f"{step}-{g}-{i}",
                                                        prompt=chat.render("user", task.instruction), params=params))
                        for g, task in enumerate(batch) for i in range(group)]
            spans = await asyncio.gather(*requests)
            groups, rewards = [], []
            for g, task in enumerate(batch):
                trajectories = []
                for i in range(group):
                    span = spans[g * group + i]
                    reward = score(task.metadata["numbers"], task.metadata["target"],
                                   chat.decode([token for token in span.token_ids() if token not in end]))
                    rewards.append(reward)
                    turns = [Turn(role="user", tokens=pack_u32(chat.render("user", task.instruction))),
                             Turn(role="assistant", generated=span)]
                    trajectories.append(Trajectory(trajectory_id=f"{step}-{g}-{i}", task_id=task.task_id,
                                                   group_id=f"{step}-{g}", sample_index=i, reward=reward,
                                                   segments=[TrajectorySegment(turns=turns)]))
                if len({t.reward for t in trajectories}) > 1 or not skip_zero_variance:
                    groups.append(Group(group_id=f"{step}-{g}", task_id=task.task_id, trajectories=trajectories))
            record = {"reward": sum(rewards) / len(rewards)}
            if step == steps - 1:
                record.update(routing_bytes_per_token(groups or [Group(group_id="g", task_id="t", trajectories=trajectories)]))
            if groups:
                metrics = trainer.step(groups)
                record.update(entropy=metrics["entropy/token_mean"], kl=metrics["mismatch/kl_k3"],
                              abs_log_ratio=metrics["mismatch/abs_log_ratio"], ratio_max=metrics["mismatch/ratio_max"],
                              set_differs=metrics.get("routing/set_differs", 0.0),
                              top1_differs=metrics.get("routing/top1_differs", 0.0))
                engine.pause()
                engine.load_weights(engine_weights(policy), trainer.version)
                engine.resume()
            history.append(record)
    finally:
        await engine.close()
    return history


def routing_bytes_per_token(groups: list[Group]) -> dict[str, float]:
    """What the routing records add to a stored rollout segment (msgpack + zstd), per routed position."""
    from relayrl.core import codec
    from relayrl.core.wire import RolloutSegment

    def without_routing(group: Group) -> Group:
        return msgspec.structs.replace(group, trajectories=[msgspec.structs.replace(trajectory, segments=[
            msgspec.structs.replace(segment, turns=[msgspec.structs.replace(turn, generated=msgspec.structs.replace(
                turn.generated, routing=None)) if turn.generated is not None else turn for turn in segment.turns])
            for segment in trajectory.segments]) for trajectory in group.trajectories])

    positions = sum(len(span.routing) for group in groups for trajectory in group.trajectories
                    for span in trajectory.generated_spans() if span.routing is not None)
    if not positions:
        return {}
    stored = len(codec.encode_compressed(RolloutSegment(producer_id="p", sequence=0, groups=list(groups))))
    bare = len(codec.encode_compressed(RolloutSegment(producer_id="p", sequence=0,
                                                      groups=[without_routing(group) for group in groups])))
    layers_k = next(span.routing.layers * span.routing.top_k for group in groups for trajectory in group.trajectories
                    for span in trajectory.generated_spans() if span.routing is not None)
    return {"routing_bytes_per_position": (stored - bare) / positions, "routing_raw_bytes_per_position": float(layers_k)}


# ------------------------------------------------------------------------------ summaries
def render(runs: dict[str, dict[int, dict]], steps: int, seeds: list[int]) -> str:
    """The docs' table (mean over seeds and range, per shown tenth) and the replay / no-replay ratios."""
    def column(name: str, key: str, tenth: int) -> list[float]:
        values = [tenths(run["history"], key)[tenth] for run in runs[name].values()]
        return [value for value in values if value is not None]

    lines = [f"{len(seeds)} seed(s), {steps} steps of 16 prompts x 8 per run, bfloat16 engine, float32 trainer; "
             "mean over seeds (min-max):", "",
             "| | " + " | ".join(f"{t + 1}/10" for t in SHOWN_TENTHS) + " |", "|---|" + "---|" * len(SHOWN_TENTHS)]
    for key, title, fmt in KEYS:
        for name in runs:
            lines.append(f"| {title}, {name} | " + " | ".join(spread(column(name, key, t), fmt) for t in SHOWN_TENTHS)
                         + " |")
    if set(ARMS) <= set(runs):
        lines += ["", "| replay / no-replay, per seed (mean) | whole run | last tenth |", "|---|---|---|"]

        def ratios(key: str, which: slice) -> str:
            found = []
            for seed in seeds:
                mine = [value for value in tenths(runs["replay"][seed]["history"], key)[which] if value is not None]
                theirs = [value for value in tenths(runs["no-replay"][seed]["history"], key)[which] if value is not None]
                if mine and theirs and statistics.fmean(theirs):
                    found.append(statistics.fmean(mine) / statistics.fmean(theirs))
            return f"{', '.join(f'{ratio:.2f}' for ratio in found)} ({statistics.fmean(found):.2f}x)" if found else "-"

        for key, title, _ in KEYS[1:]:
            lines.append(f"| {title} | {ratios(key, slice(0, 10))} | {ratios(key, slice(9, 10))} |")
        lines.append("")
    stored = [run["history"][-1]["routing_bytes_per_position"] for arm in runs.values() for run in arm.values()
              if "routing_bytes_per_position" in run["history"][-1]]
    raw = [run["history"][-1]["routing_raw_bytes_per_position"] for arm in runs.values() for run in arm.values()
           if "routing_raw_bytes_per_position" in run["history"][-1]]
    if stored:
        lines.append(f"Routing records in the stored rollout segments (msgpack + zstd, last step of every run): "
                     f"{statistics.fmean(stored):.2f} bytes per routed position ({min(stored):.2f}-{max(stored):.2f}), "
                     f"against {raw[0]:.0f} bytes raw (layers x top-k, one byte per expert id).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one seed, tiny warm-up, few steps, no results file")
    args = parser.parse_args(argv)
    steps, warmup, prompts = (4, 5, 4) if args.quick else (args.steps, 70, 16)
    seeds = args.seeds[:1] if args.quick else args.seeds
    torch.set_num_threads(1 if args.quick else 2)
    revision = commit()

    runs: dict[str, dict[int, dict]] = {name: {} for name in ARMS}
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="relayrl-routing-") as temp:
            model, chat = warmed_model(Path(temp), warmup, seed)
        for name, replay in ARMS.items():
            started = time.perf_counter()
            # The smoke run's model solves nothing yet: train on zero-variance groups so the step runs.
            history = asyncio.run(run_arm(replay, model, chat, steps, prompts, 8, seed=seed,
                                          skip_zero_variance=not args.quick))
            runs[name][seed] = {"history": history, "seconds": time.perf_counter() - started}
            last = history[-1]
            print(f"seed {seed}, {name}: {steps} steps in {runs[name][seed]['seconds']:.0f} s; last step: success "
                  f"{last['reward']:.3f}, expert sets differing {last.get('set_differs', float('nan')):.4f}, mismatch KL "
                  f"{last.get('kl', float('nan')):.5f}", file=sys.stderr, flush=True)
    markdown = render(runs, steps, seeds)
    print("\n" + markdown)
    if not args.quick:
        data = {"steps": steps, "seeds": seeds, "warmup_steps": warmup, "prompts": prompts, "group": 8,
                "runs": {name: {str(seed): {"seconds": run["seconds"],
                                            **{key: tenths(run["history"], key) for key, _, _ in KEYS}}
                                for seed, run in seeds_runs.items()} for name, seeds_runs in runs.items()}}
        path = write_results("routing_replay", command=command_line(argv), markdown=markdown, data=data,
                             revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
