"""Elastic trainer ranks: what losing a rank costs the run, elastic against restarting every rank.

Two runs of the quickstart (``relayrl run``) with three torch trainer ranks, one after the other on
the same machine: ``[trainer] elastic = true`` and ``elastic = false`` (a rank's death restarts
every rank, which resume from the newest checkpoint). In each, once training is steady, rank
``trainer-1`` is SIGKILLed ``--kills`` times at random moments (seeded), waiting for the trainer to
be whole again before the next kill. Per kill it measures, from the leader's metrics:

* **stall**: the gap before the first step trained by fewer ranks (elastic; a step in flight may
  still finish with three) or by the restarted ranks (restart-all), less the median gap between
  steps before any kill (what the kill added at once);
* **lost until whole**: from the last step before the kill to the first step trained by three
  ranks again, less the median gap times the steps finished in between: everything the kill cost
  (elastic: the shrink, the steps at two ranks, the pause that hands the rejoining rank its state;
  restart-all: the restart and resume);
* **back to full size**: from the kill to the first step trained by three ranks again.

It prints both modes' medians and the ratio of their stalls, and checks each run's ledger
(``verify_run``: every group trained once). Absolute times depend on the machine and its load.

    python benchmarks/elastic_ranks.py            # 4 kills per mode
    python benchmarks/elastic_ranks.py --quick    # a CI smoke run: 1 kill per mode
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parents[1]
RANKS = 3
ARGS = ["--steps", "2000", "--no-report", "--set", "trainer.warmup.steps=3",
        "--set", "rollout.environment_options.tasks=500", "--set", "buffer.batch_groups=2",
        "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
        "--set", f"trainer.ranks={RANKS}", "--set", "rollout.max_restarts=20"]


def _records(run_dir: Path) -> list[dict]:
    from relayrl.trainer.metrics import read_metrics

    return read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []


def _world(record: dict, elastic: bool) -> float:
    return record["metrics"].get("elastic/world_size", RANKS) if elastic else RANKS


def measure(run_dir: Path, *, elastic: bool, kills: int, rng: random.Random, timeout_s: float) -> dict:
    """One run with ``kills`` SIGKILLs of trainer-1; per-kill stalls and times back to full size."""
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                            "--run-dir", str(run_dir), *ARGS, "--set", f"trainer.elastic={str(elastic).lower()}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    kill_times: list[tuple[float, int]] = []  # (wall time of the kill, steps finished before it)
    try:
        deadline = time.monotonic() + timeout_s
        while run.poll() is None and time.monotonic() < deadline:
            records = _records(run_dir)
            whole = len(records) >= 6 and all(_world(r, elastic) == RANKS for r in records[-3:])
            settled = not kill_times or len(records) > kill_times[-1][1] + 3
            if len(kill_times) == kills and whole and settled:
                break
            if len(kill_times) < kills and whole and settled:
                time.sleep(rng.uniform(0.0, 0.5))
                children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
                before = len(_records(run_dir))
                os.kill(children["trainer-1"], signal.SIGKILL)
                kill_times.append((time.time(), before))
            time.sleep(0.1)
        if run.poll() is not None or len(kill_times) < kills:
            output = run.communicate(timeout=30)[0] if run.poll() is not None else ""
            raise SystemExit(f"the {'elastic' if elastic else 'restart-all'} run did not finish its kills:\n"
                             f"{output[-3000:]}")
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()

    from relayrl.cli.report import load_events
    from relayrl.cli.run.ledger import verify_run

    check = verify_run(run_dir)
    if not check.ok:
        raise SystemExit(f"ledger audit failed: {check.errors[:3]}")
    records = _records(run_dir)
    times = [record["time"] for record in records]
    first_kill = kill_times[0][1]
    normal_gap = statistics.median(b - a for a, b in itertools.pairwise(times[2:first_kill]))
    stalls, lost, regrown = [], [], []
    for killed_at, _ in kill_times:
        after = next(i for i, t in enumerate(times) if t > killed_at)  # the first step finished after the kill
        last_before = times[after - 1]
        if elastic:  # a step in flight may still finish with three ranks: the shrink shows in the next one
            shrunk = next(i for i in range(after, len(records)) if _world(records[i], elastic) < RANKS)
            whole = next(i for i in range(shrunk, len(records)) if _world(records[i], elastic) == RANKS)
        else:  # every rank restarts (a step in flight may still finish first): the restarted ranks' first step
            resumed = min(event.time for event in load_events(run_dir) if event.kind == "resumed"
                          and event.time > killed_at)
            shrunk = whole = next(i for i, t in enumerate(times) if t > resumed)
        stalls.append(times[shrunk] - times[shrunk - 1] - normal_gap)
        lost.append(times[whole] - last_before - (whole - after + 1) * normal_gap)
        regrown.append(times[whole] - killed_at)
    return {"stalls": stalls, "lost": lost, "regrown": regrown, "normal_gap": normal_gap, "steps": len(records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one kill per mode (a CI smoke run)")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kills = 1 if args.quick else args.kills
    rng = random.Random(args.seed)
    revision = commit()
    print(f"# elastic trainer ranks: {RANKS} torch ranks on the quickstart, {kills} SIGKILL(s) of trainer-1 per "
          f"mode (seed {args.seed}); python {platform.python_version()}, {os.cpu_count()} cores", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for elastic in (True, False):
            name = "elastic" if elastic else "restart-all"
            results[name] = measure(Path(scratch) / name, elastic=elastic, kills=kills, rng=rng,
                                    timeout_s=300 + 120 * kills)
    lines = [f"{RANKS} torch ranks on the quickstart, {kills} SIGKILL(s) of `trainer-1` at random moments per mode "
             f"(seed {args.seed}); python {platform.python_version()}, {os.cpu_count()} cores:", "",
             "| mode | step gap before kills (s) | stall per kill (s) | lost until whole (s) | kill to full size (s) |",
             "|---|---|---|---|---|"]
    for name, result in results.items():
        cells = [f"{statistics.median(result[key]):.2f} ({', '.join(f'{v:.1f}' for v in result[key])})"
                 for key in ("stalls", "lost", "regrown")]
        lines.append(f"| {name} | {result['normal_gap']:.2f} | {' | '.join(cells)} |")
    lines += ["", "(medians; each kill in brackets)"]
    for key, what in (("stalls", "stalls the trainer"), ("lost", "loses")):
        ratio = statistics.median(results["restart-all"][key]) / max(statistics.median(results["elastic"][key]), 1e-3)
        lines.append(f"restart-all {what} {ratio:.1f}x as long per kill as elastic ranks.")
    lines.append("Both runs' ledgers verified: every group trained once.")
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("elastic_ranks", command=command_line(), markdown=markdown, data=results,
                             revision=revision)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
