"""The torch engine's two levers for rollouts, each against its own baseline in the same process.

1. **Continuous batching** against static batching (``TorchEngine(continuous_batching=False)``: a
   request admitted only when the running batch is empty, what the engine did before). Groups of
   ``--group`` samples arrive on a seeded schedule (exponential gaps), each with its own prompt and
   answer length, as a fleet's requests do; both engines serve the same schedule. Printed: wall
   clock from the first arrival to the last answer, mean latency (arrival to last token), generated
   tokens per second, and the ratios continuous / static.
2. **Prefix reuse across turns** against no reuse (``prefix_cache_mib=0``): ``--trajectories``
   multi-turn trajectories at once, each turn's prompt the previous context + its answer + a tool
   result, as an agent's are. Printed: prompt tokens run through the model per generated token, the
   share of prompt tokens taken from kept prefixes, wall clock, and the ratios.

Both parts count the seeded requests whose tokens differ between the two sides (the levers change how
the work is batched, not what is sampled; float rounding under other batch shapes could flip a rare
near-tie, and the table would show it). Seeds are run back to back; every seed is
reported, with the mean and range of each ratio. Writes ``benchmarks/results/engine_batching.json``
(docs/performance.md renders it).

Usage: ``python benchmarks/engine_batching.py [--seeds 0,1,2] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import build_model
from results import command_line, commit, write_results


def arrival_schedule(seed: int, groups: int, group: int, mean_gap_s: float) -> list[tuple[float, list[Any]]]:
    """``(arrival time, requests)`` per group: a seeded prompt (8-48 tokens) and answer budgets (16-96)."""
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams

    rng = random.Random(seed)
    schedule, clock = [], 0.0
    for index in range(groups):
        prompt = [rng.randrange(3, 512) for _ in range(rng.randint(8, 48))]
        requests = [GenerateRequest(request_id=f"g{index}/{sample}", prompt=prompt,
                                    params=SamplingParams(max_tokens=rng.randint(16, 96), top_p=0.95,
                                                          seed=seed * 100_000 + index * 100 + sample))
                    for sample in range(group)]
        schedule.append((clock, requests))
        clock += rng.expovariate(1.0 / mean_gap_s)
    return schedule


async def serve_schedule(engine, schedule) -> tuple[float, float, int, dict[str, list[int]]]:
    """Send each group at its time; ``(wall clock, mean latency, generated tokens, tokens by request)``."""
    start = time.perf_counter()
    latencies: list[float] = []
    tokens: dict[str, list[int]] = {}

    async def one(at: float, request) -> None:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        sent = time.perf_counter()
        span = await engine.generate(request)
        latencies.append(time.perf_counter() - sent)
        tokens[request.request_id] = list(span.token_ids())

    await asyncio.gather(*(one(at, request) for at, requests in schedule for request in requests))
    return time.perf_counter() - start, statistics.fmean(latencies), sum(map(len, tokens.values())), tokens


async def serve_trajectories(engine, seed: int, trajectories: int, turns: int) -> tuple[float, dict[str, list[int]]]:
    """``trajectories`` agents at once, ``turns`` turns each: ``(wall clock, tokens by request)``."""
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams

    rng = random.Random(seed)
    contexts = [[rng.randrange(3, 512) for _ in range(96)] for _ in range(trajectories)]
    results = [[rng.randrange(3, 512) for _ in range(rng.randint(16, 48))] for _ in range(trajectories * turns)]
    tokens: dict[str, list[int]] = {}

    async def agent(index: int) -> None:
        context = contexts[index]
        for turn in range(turns):
            request = GenerateRequest(request_id=f"t{index}/{turn}", prompt=context,
                                      params=SamplingParams(max_tokens=32, top_p=0.95, seed=seed * 1000 + index * 10 + turn))
            span = await engine.generate(request)
            tokens[request.request_id] = list(span.token_ids())
            context = context + tokens[request.request_id] + results[index * turns + turn]

    start = time.perf_counter()
    await asyncio.gather(*(agent(index) for index in range(trajectories)))
    return time.perf_counter() - start, tokens


def run_engine(model, coroutine_factory, **options):
    """Serve one workload on a fresh engine over ``model``; the workload's result and the engine's health."""
    from relayrl.rollout.engines.torch_engine import TorchEngine

    async def go():
        engine = TorchEngine(model, max_batch=64, **options)
        try:
            return await coroutine_factory(engine), await engine.health()
        finally:
            await engine.close()

    return asyncio.run(go())


def spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--mean-gap-s", type=float, default=0.15)
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and one seed, no results file")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    if args.quick:
        seeds, args.groups, args.trajectories, args.turns = seeds[:1], 4, 3, 2
    revision = commit()
    model = build_model(args.width, args.layers)
    parameters = sum(p.numel() for p in model.parameters())
    run_engine(model, lambda engine: serve_schedule(engine, arrival_schedule(99, 2, 2, 0.01)))  # warm-up

    batching_rows, batching = [], {"wall": [], "latency": [], "rate": []}
    reuse_rows, reuse = {"prefill": [], "wall": []}, []
    for seed in seeds:
        schedule = arrival_schedule(seed, args.groups, args.group, args.mean_gap_s)
        order = [("continuous", True), ("static", False)] if seed % 2 == 0 else [("static", False), ("continuous", True)]
        measured = {}
        for name, continuous in order:  # each seed puts a different side first
            (wall, latency, generated, tokens), _ = run_engine(
                model, lambda engine, schedule=schedule: serve_schedule(engine, schedule), continuous_batching=continuous)
            measured[name] = (wall, latency, generated / wall, tokens)
        differ = sum(measured["continuous"][3][key] != measured["static"][3][key] for key in measured["static"][3])
        continuous, static = measured["continuous"], measured["static"]
        batching["wall"].append(continuous[0] / static[0])
        batching["latency"].append(continuous[1] / static[1])
        batching["rate"].append(continuous[2] / static[2])
        batching_rows.append(f"| {seed} | {static[0]:.1f} | {continuous[0]:.1f} | {static[1]:.2f} | {continuous[1]:.2f} | "
                             f"{static[2]:.0f} | {continuous[2]:.0f} | {continuous[2] / static[2]:.2f} | {differ} |")

        sides = {}
        for name, mib in ([("reuse", 256.0), ("whole", 0.0)] if seed % 2 == 0 else [("whole", 0.0), ("reuse", 256.0)]):
            (wall, tokens), health = run_engine(
                model, lambda engine, seed=seed: serve_trajectories(engine, seed, args.trajectories, args.turns),
                prefix_cache_mib=mib)
            sides[name] = (wall, tokens, health)
        differ = sum(sides["reuse"][1][key] != sides["whole"][1][key] for key in sides["whole"][1])
        per_generated = {name: side[2]["prefill_tokens"] / side[2]["generated_tokens"] for name, side in sides.items()}
        reused_share = sides["reuse"][2]["reused_tokens"] / (sides["reuse"][2]["reused_tokens"] + sides["reuse"][2]["prefill_tokens"])
        reuse_rows["prefill"].append(per_generated["whole"] / per_generated["reuse"])
        reuse_rows["wall"].append(sides["reuse"][0] / sides["whole"][0])
        reuse.append(f"| {seed} | {per_generated['whole']:.2f} | {per_generated['reuse']:.2f} | {reused_share:.0%} | "
                     f"{sides['whole'][0]:.1f} | {sides['reuse'][0]:.1f} | {sides['reuse'][0] / sides['whole'][0]:.2f} | {differ} |")

    lines = [
        f"A Llama-style model of {parameters / 1e6:.1f}M parameters ({args.layers} layers, width {args.width}), "
        f"`max_batch` 64, torch {torch.__version__}, {torch.get_num_threads()} threads; seeds {', '.join(map(str, seeds))}, "
        "the two sides of a seed back to back in one process, every seed shown.", "",
        f"**Continuous batching.** {args.groups} groups of {args.group} samples (prompts of 8-48 tokens, answers of "
        f"16-96) arriving {args.mean_gap_s} s apart on average:", "",
        "| seed | static wall s | continuous wall s | static latency s | continuous latency s | static tok/s | "
        "continuous tok/s | tok/s continuous / static | requests whose tokens differ |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *batching_rows, "",
        f"Continuous / static, mean (range): wall clock {spread(batching['wall'])}, mean latency "
        f"{spread(batching['latency'])}, tokens per second {spread(batching['rate'])}.", "",
        f"**Prefix reuse across turns.** {args.trajectories} trajectories at once, {args.turns} turns each (a 96-token "
        "first prompt; each turn answers up to 32 tokens and appends a tool result of 16-48):", "",
        "| seed | prefill tokens per generated, whole | with reuse | prompt tokens reused | wall s, whole | "
        "wall s, reuse | wall reuse / whole | requests whose tokens differ |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|", *reuse, "",
        f"Prefill tokens per generated token cut {spread(reuse_rows['prefill'])}x by reuse; wall clock reuse / "
        f"whole {spread(reuse_rows['wall'])}.",
    ]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        data = {"batching": batching, "prefill_cut": reuse_rows["prefill"], "reuse_wall": reuse_rows["wall"], "seeds": seeds}
        print(f"wrote {write_results('engine_batching', command=command_line(), markdown=markdown, data=data, revision=revision)}")


if __name__ == "__main__":
    main()
