"""Prompt tokens the engine runs per generated token on the multi-turn agent example, with and without
the levers that cut them.

An agent's every turn sends its whole context (system prompt, task, every earlier turn and tool
result) as the next request's prompt, and a group's samples send the same first prompt. Runs of
``relayrl run examples/agent.toml`` for ``--steps`` RL steps, per seed, three ways:

* ``as shipped``: prefix reuse (the engine keeps a finished turn's KV cache and the next turn
  prefills only its new tokens) and group calls (a group's first turns go to the engine as one
  call: the prompt prefilled once);
* ``no prefix reuse``: ``rollout.engine_options.prefix_cache_mib = 0``;
* ``neither``: no prefix reuse and ``rollout.group_calls = false`` (every sample's request alone);
* ``reuse across updates``: as shipped but ``weight_sync.reset_caches_on_apply = false``: a weight
  update (every step here) no longer drops the kept prefixes, so a next turn that arrives after one
  reuses KV computed under the previous weights, the approximation a request in flight during an
  update already makes (its logprobs are the engine's own; the IS correction and the mismatch
  monitor see the difference). As shipped, every update drops them.

Per run, from the engine's own counters (``fleet/prefill_per_generated`` of the last step: every
prompt token run through the model, over every token generated, since the engine started): prompt
tokens per generated token, the share of prompt tokens taken from kept prefixes, the fleet's tokens
per second and the RL steps per second. Then per seed the cut, ``neither`` / ``as shipped``, with
its mean and range over seeds. Every run is shown; a run that fails ends the benchmark with its log.

Usage: ``python benchmarks/agent_prefill.py [--seeds 0,1,2] [--steps 15] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_vs_sync import read_records
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "agent.toml"
SIDES: dict[str, list[str]] = {
    "as shipped": [],
    "no prefix reuse": ["--set", "rollout.engine_options.prefix_cache_mib=0"],
    "neither": ["--set", "rollout.engine_options.prefix_cache_mib=0", "--set", "rollout.group_calls=false"],
    "reuse across updates": ["--set", "weight_sync.reset_caches_on_apply=false"],
}
QUICK = ["--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.demonstrations=8",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']"]


def run(side: str, seed: int, steps: int, quick: bool) -> dict[str, float]:
    """One run of the agent example; its last step's engine counters and its rates."""
    with tempfile.TemporaryDirectory(prefix="relayrl-agent-prefill-") as folder:
        run_dir = Path(folder) / "run"
        command = [sys.executable, "-m", "relayrl.cli", "run", str(CONFIG), "--run-dir", str(run_dir),
                   "--steps", str(steps), "--no-report", "--set", f"run.seed={seed}", *SIDES[side],
                   *(QUICK if quick else [])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{side} (seed {seed}) failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
        records = read_records(run_dir / "metrics.jsonl")
    if len(records) < 2:
        raise SystemExit(f"{side} (seed {seed}): {len(records)} step(s) recorded")
    last = records[-1]["metrics"]
    elapsed = max(records[-1]["time"] - records[0]["time"], 1e-9)
    return {"prefill_per_generated": float(last.get("fleet/prefill_per_generated", 0.0)),
            "reused_share": float(last.get("fleet/prefix_reused_share", 0.0)),
            "tokens_per_s": float(last.get("fleet/tokens_per_s", 0.0)),
            "steps_per_s": (len(records) - 1) / elapsed, "steps": float(len(records))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--quick", action="store_true",
                        help="one seed, 2 steps, a tiny warm-up, two sides (as shipped, neither); no results file")
    args = parser.parse_args(argv)
    revision = commit()
    seeds = [0] if args.quick else [int(seed) for seed in args.seeds.split(",")]
    steps = 2 if args.quick else args.steps
    rows: list[str] = []
    cuts: dict[str, list[float]] = {}
    for seed in seeds:
        results = {}
        sides = ["as shipped", "neither"] if args.quick else list(SIDES)  # quick: the two ends only
        order = sides[seed % len(sides):] + sides[:seed % len(sides)]  # each side goes first in turn
        for side in order:
            results[side] = run(side, seed, steps, args.quick)
            found = results[side]
            print(f"{side} seed {seed}: {found['prefill_per_generated']:.2f} prompt tokens per generated token",
                  flush=True)
            rows.append(f"| {side} | {seed} | {found['prefill_per_generated']:.2f} | {found['reused_share']:.2f} | "
                        f"{found['tokens_per_s']:.0f} | {found['steps_per_s']:.2f} |")
        for side in results:
            if side != "neither":
                cuts.setdefault(side, []).append(results["neither"]["prefill_per_generated"]
                                                 / max(results[side]["prefill_per_generated"], 1e-9))
    lines = [f"`relayrl run examples/agent.toml`, {steps} RL steps per run; the engine's counters at the last step:", "",
             "| side | seed | prompt tokens run per generated token | share of prompt tokens reused | "
             "fleet tokens/s | steps/s |", "|---|---|---|---|---|---|", *rows, ""]
    lines += [f"Prompt tokens run per generated token, neither / {side}: **{statistics.fmean(found):.2f}x** "
              f"(range {min(found):.2f}-{max(found):.2f}, {len(found)} seed(s))." for side, found in cuts.items()]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("agent_prefill", command=command_line(argv), markdown=markdown,
                             data={"steps": steps, "cuts": cuts, "rows": rows}, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
