"""How far the supervised warm-up takes the code-search agent before RL: reward vs warm-up steps.

RL needs a policy that sometimes succeeds. This script builds examples/agent.toml's fresh model,
warms it up on the environment's expert demonstrations (played through the real harness and
sandboxes, as ``relayrl run`` does), then samples held-out tasks through the torch engine, the real
harness and sandboxed tools and grading, and prints, per warm-up length: the grader's mean reward
(F1), the share of samples with any reward, tool calls per trajectory, the share of turns with
parallel calls, and the warm-up's seconds (this machine; compare lengths within one run only).

    python benchmarks/agent_warmup.py --steps 100 200 400
    python benchmarks/agent_warmup.py --quick        # a smoke run: 5 steps, 8 samples
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 200, 400], help="warm-up lengths to compare")
    parser.add_argument("--lr", type=float, default=None, help="warm-up learning rate (default: the example's)")
    parser.add_argument("--samples", type=int, default=128, help="held-out samples per warm-up length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 steps, 8 samples, 16 demonstrations")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.samples = [5], 8
    revision = commit()

    import msgspec
    import torch

    from relayrl.core.config import load_config
    from relayrl.rollout.agent import iter_segments
    from relayrl.rollout.config import build_environment, build_harness
    from relayrl.rollout.engines.torch_engine import TorchEngine
    from relayrl.rollout.models import load_model, load_tokenizer, make_chat_format, materialize_model
    from relayrl.rollout.routing import TokenRecordingProxy
    from relayrl.trainer.warmup import MaskedExample, supervised_warmup

    torch.set_num_threads(args.threads)
    config = load_config(ROOT / "examples" / "agent.toml")
    rollout = config.rollout
    if args.quick:
        rollout = msgspec.structs.replace(rollout, environment_options={**rollout.environment_options, "demonstrations": 16})
    environment = build_environment(rollout)
    harness = build_harness(rollout)
    section = config.trainer.warmup
    if args.lr is not None:
        section = msgspec.structs.replace(section, lr=args.lr)
    with tempfile.TemporaryDirectory() as temp:
        model_dir = materialize_model(config.model, Path(temp) / "model", alphabet=environment.alphabet,
                                      specials=environment.specials, seed=config.run.seed)
        tokenizer = load_tokenizer(model_dir)
        chat = make_chat_format(config.model, tokenizer)
        started = time.monotonic()
        demonstrations = asyncio.run(environment.demonstrate(harness=harness, chat=chat, tokenizer=tokenizer))
        examples = [MaskedExample(tokens, trained) for trajectory in demonstrations
                    for tokens, trained in iter_segments(trajectory)]
        lines = [f"{len(demonstrations)} demonstrations ({len(examples)} segments) in "
                 f"{time.monotonic() - started:.1f} s; {args.samples} held-out samples per warm-up length, "
                 f"{args.threads} threads:", "",
                 "| warm-up steps | warm-up s | reward (F1) | any reward | tool calls / traj | parallel turns |",
                 "|---|---|---|---|---|---|"]
        print("\n".join(lines), flush=True)
        rows = []
        for steps in args.steps:
            model = load_model(model_dir)
            started = time.monotonic()
            supervised_warmup(model, examples, msgspec.structs.replace(section, steps=steps), seed=config.run.seed,
                              pad_token_id=getattr(tokenizer, "pad_token_id", 0) or 0)
            seconds = time.monotonic() - started
            graded = asyncio.run(_sample(environment, harness, chat, TorchEngine(model, max_batch=128),
                                         TokenRecordingProxy, config, args.samples))
            rewards = [trajectory.reward for trajectory in graded]
            calls = [len(turn.tool_calls) for trajectory in graded for segment in trajectory.segments
                     for turn in segment.turns if turn.role == "assistant"]
            row = {"steps": steps, "seconds": seconds, "reward": statistics.mean(rewards),
                   "any_reward": statistics.mean(reward > 0 for reward in rewards),
                   "tool_calls": sum(calls) / len(graded),
                   "parallel_turns": sum(count >= 2 for count in calls) / max(len(calls), 1)}
            rows.append(row)
            lines.append(f"| {steps} | {seconds:.0f} | {row['reward']:.3f} | {row['any_reward']:.2f} | "
                         f"{row['tool_calls']:.2f} | {row['parallel_turns']:.2f} |")
            print(lines[-1], flush=True)
    if not args.quick:
        path = write_results("agent_warmup", command=command_line(), markdown="\n".join(lines),
                             data={"rows": rows, "samples": args.samples}, revision=revision)
        print(f"wrote {path}")


async def _sample(environment, harness, chat, engine, proxy_type, config, samples: int):
    from relayrl.rollout.protocol import SamplingParams

    proxy = proxy_type(engine)
    sampling = SamplingParams(temperature=config.algo.sampling.temperature, top_p=config.algo.sampling.top_p)
    tasks = environment.eval_tasks()
    limit = asyncio.Semaphore(64)

    async def one(index: int):
        task = tasks[index % len(tasks)]
        async with limit, environment.tools(task) as tools:
            trajectory = await harness.run(task, proxy=proxy, tools=tools, chat=chat, sampling=sampling,
                                           group_id=task.task_id, sample_index=index)
        return (await environment.grade(task, [trajectory], [""]))[0]

    try:
        return await asyncio.gather(*(one(index) for index in range(samples)))
    finally:
        await engine.close()


if __name__ == "__main__":
    sys.exit(main())
