"""What the alternating length penalty changes in behaviour: the agentic example with the penalty
against the same run without it (same seed, same demonstrations), alternating (off, on, off, on ...).

The example's warm-up is given a behaviour that costs more under the penalty than under the grader
alone: most expert demonstrations search one identifier per turn (``sequential``, one turn
more than searching both at once, ``parallel``; both find the same files). The penalty charges
tokens and turns (``w_tokens = 1``, ``w_turns = 20``, no tool seconds, whose wall time on two busy
cores would make the cost a measure of the machine) above a budget of 65 that a parallel search
stays near and a sequential one exceeds by about a third (coefficient 1: a third off its reward).
"Off" is the same config with every phase unconstrained.

Per tenth of the steps, over every graded trajectory (trained on or not; the fleet's per-step means
in ``metrics.jsonl``): assistant turns per trajectory (a sequential search takes three, a parallel
one two), the share of turns with parallel calls (a parallel search's is one in two), generated
tokens, the grader's reward and the mean penalty. It prints both runs' tables for the first seed,
each seed's last tenth, and the means over seeds.

    python benchmarks/length_penalty_effect.py              # 80 steps, seeds 0 and 1
    python benchmarks/length_penalty_effect.py --quick      # a smoke run: 10 steps, one seed, nothing written

``--behaviour verbose`` gives the warm-up a behaviour the grader cannot see at all: most experts
search in parallel and then name every file twice in their answer (``verbose``: the F1 of a set of
files is the same, the answer longer). The penalty charges generated tokens only, above a budget of
20 that every success exceeds (coefficient 1), so a verbose success loses more than a plain one;
without the penalty the two earn the same. An extra column counts the answers that name a file
more than once among the successes (over the groups trained in each tenth). Its results file is
``length_penalty_effect-verbose``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from example_run import mean, tenths
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parents[1]
PENALTY = "algo.reward_shapers.length-penalty"
BEHAVIOURS = {
    "sequential": ["--set", "rollout.environment_options.demonstration_styles="
                            "{parallel=0.15, sequential=0.4, early-stop=0.05, no-search=0.4}",
                   "--set", f"{PENALTY}.budget=65.0", "--set", f"{PENALTY}.w_tokens=1.0",
                   "--set", f"{PENALTY}.w_turns=20.0"],
    "verbose": ["--set", "rollout.environment_options.demonstration_styles={parallel=0.3, verbose=0.3, no-search=0.4}",
                "--set", f"{PENALTY}.budget=20.0", "--set", f"{PENALTY}.w_tokens=1.0", "--set", f"{PENALTY}.w_turns=0.0"],
}
"""The warm-up's costlier behaviour and the penalty's weights that charge it (see the docstring)."""
COMMON = ["--no-report", "--set", f"{PENALTY}.w_tool_seconds=0.0", "--set", f"{PENALTY}.coefficient=1.0"]
ARMS = {"off": ["--set", f'{PENALTY}.schedule=[{{kind="unconstrained", steps=1000}}]'],
        "on": ["--set", f'{PENALTY}.schedule=[{{kind="unconstrained", steps=20}}, {{kind="budget", steps=20}}]']}
QUICK = ["--steps", "10", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.demonstrations=8",
         "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']"]  # a barely warmed model's groups mostly all earn 0
COLUMNS = [("fleet/turns_per_trajectory", "turns"), ("fleet/parallel_turn_share", "parallel turns"),
           ("fleet/tokens_per_trajectory", "tokens"), ("reward/fleet_graded_mean", "reward (grader)"),
           ("fleet/shaping_per_trajectory", "length penalty")]
TURNS, PARALLEL, TOKENS, REWARD = (name for name, _ in COLUMNS[:4])
REPEATED = "repeated_answers"


def tenths_of_run(run_dir: Path) -> list[dict[str, Any]]:
    """Per tenth of the run's steps (cut as the report cuts them), the mean of every column over the
    steps that recorded it (NaN where none did: no group was graded)."""
    from relayrl.trainer.metrics import read_metrics

    repeated = repeated_answers_by_step(run_dir)
    rows = []
    for chunk in tenths(list(read_metrics(run_dir))):
        means = {name: mean(chunk, name) for name, _ in COLUMNS}
        counts = [repeated[record["step"]] for record in chunk if record["step"] in repeated]
        answers = sum(total for _, total in counts)
        rows.append({name: math.nan if value is None else value for name, value in means.items()}
                    | {"steps": f"{chunk[0]['step']}-{chunk[-1]['step']}",
                       REPEATED: sum(hits for hits, _ in counts) / answers if answers else math.nan})
    return rows


def repeated_answers_by_step(run_dir: Path) -> dict[int, tuple[int, int]]:
    """Per trainer step, (successes naming a file more than once, successes) over the groups it
    trained. Successes only: a failed answer that names one file twice instead of two files is a
    copying slip, not the verbose behaviour, and the penalty never charges failures."""
    from relayrl.cli.view import collect_groups
    from relayrl.environments.code_search import final_answer

    counts: dict[int, tuple[int, int]] = {}
    for entry in collect_groups(run_dir):
        if entry["outcome"] != "trained":
            continue
        for trajectory in entry["group"].trajectories:
            if trajectory.reward_components.get("success", 0.0) < 1.0:  # the grader's, before any penalty
                continue
            files = [token for token in final_answer(trajectory).split() if token.endswith(".py")]
            hits, total = counts.get(entry["step"], (0, 0))
            counts[entry["step"]] = (hits + (len(files) > len(set(files))), total + 1)
    return counts


def one_run(run_dir: Path, arm: str, seed: int, quick: bool, behaviour: str = "sequential") -> list[dict[str, float]]:
    command = [sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/agent.toml"), "--run-dir", str(run_dir),
               "--set", f"run.seed={seed}", *COMMON, *BEHAVIOURS[behaviour], *ARMS[arm], *(QUICK if quick else [])]
    run = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                         timeout=3600)
    if run.returncode != 0:
        raise SystemExit(f"the {arm} run (seed {seed}) failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    return tenths_of_run(run_dir)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    lines = ["| steps | " + " | ".join(label for _, label in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row['steps']} | " + " | ".join(f"{row[name]:.3f}" for name, _ in columns) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="10 steps, one seed, nothing written")
    parser.add_argument("--behaviour", choices=sorted(BEHAVIOURS), default="sequential",
                        help="the warm-up's costlier behaviour (see the docstring)")
    args = parser.parse_args(argv)
    verbose = args.behaviour == "verbose"
    columns = COLUMNS + ([(REPEATED, "successes naming a file twice")] if verbose else [])
    seeds = range(1 if args.quick else args.seeds)
    revision = commit()
    runs: dict[str, dict[int, list[dict[str, float]]]] = {arm: {} for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="relayrl-length-penalty-") as scratch:
        for seed in seeds:
            for arm in ARMS:
                runs[arm][seed] = one_run(Path(scratch) / f"{arm}-{seed}", arm, seed, args.quick, args.behaviour)
                last = runs[arm][seed][-1]
                print(f"penalty {arm}, seed {seed}: last tenth turns {last[TURNS]:.2f}, parallel turns "
                      f"{last[PARALLEL]:.2f}", flush=True)

    def over_seeds(arm: str, tenth: int, name: str) -> float:
        return statistics.fmean(rows[tenth][name] for rows in runs[arm].values())

    behaviour = ("naming every file twice in their answers (the penalty charges tokens only)" if verbose else
                 "searching one identifier per turn")
    lines = [f"The agentic example with most demonstrations {behaviour}, {len(seeds)} seed(s), "
             "with the length penalty (20 unconstrained steps, then 20 budget steps, cycling) and without it "
             "(every step unconstrained). Means per tenth of the steps over every graded trajectory. Seed 0 "
             "without the penalty:", "", *table(runs["off"][0], columns), "", "Seed 0 with the penalty:", "",
             *table(runs["on"][0], columns), "", "The last tenth of each run:", "",
             "| seed | penalty | turns | parallel turns | tokens | reward (grader) |" + (" repeated |" if verbose else ""),
             "|---|---|---|---|---|---|" + ("---|" if verbose else "")]
    for seed in seeds:
        for arm in ARMS:
            last = runs[arm][seed][-1]
            lines.append(f"| {seed} | {arm} | {last[TURNS]:.2f} | {last[PARALLEL]:.2f} | {last[TOKENS]:.1f} | "
                         f"{last[REWARD]:.3f} |" + (f" {last[REPEATED]:.2f} |" if verbose else ""))
    if verbose:
        lines += ["", f"Means over the seeds, first tenth -> last: the share of successes naming a file twice "
                  f"{over_seeds('off', 0, REPEATED):.2f} -> {over_seeds('off', -1, REPEATED):.2f} without the penalty, "
                  f"{over_seeds('on', 0, REPEATED):.2f} -> {over_seeds('on', -1, REPEATED):.2f} with it; generated tokens "
                  f"per trajectory {over_seeds('off', 0, TOKENS):.1f} -> {over_seeds('off', -1, TOKENS):.1f} without, "
                  f"{over_seeds('on', 0, TOKENS):.1f} -> {over_seeds('on', -1, TOKENS):.1f} with; the grader's reward in "
                  f"the last tenth {over_seeds('off', -1, REWARD):.3f} without, {over_seeds('on', -1, REWARD):.3f} with."]
    else:
        lines += ["", f"Means over the seeds, first tenth -> last: turns per trajectory {over_seeds('off', 0, TURNS):.2f} -> "
                  f"{over_seeds('off', -1, TURNS):.2f} without the penalty, {over_seeds('on', 0, TURNS):.2f} -> "
                  f"{over_seeds('on', -1, TURNS):.2f} with it; the share of turns with parallel calls "
                  f"{over_seeds('off', 0, PARALLEL):.2f} -> {over_seeds('off', -1, PARALLEL):.2f} without, {over_seeds('on', 0, PARALLEL):.2f} -> "
                  f"{over_seeds('on', -1, PARALLEL):.2f} with; the grader's reward in the last tenth {over_seeds('off', -1, REWARD):.3f} "
                  f"without, {over_seeds('on', -1, REWARD):.3f} with."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        data = {arm: {str(seed): rows for seed, rows in by_seed.items()} for arm, by_seed in runs.items()}
        name = "length_penalty_effect" + ("-verbose" if verbose else "")
        path = write_results(name, command=command_line(argv), markdown=markdown, data=data, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
