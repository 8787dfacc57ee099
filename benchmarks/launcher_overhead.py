"""What placing a run's processes with Ray costs: the quickstart under ``--launcher ray`` against the
built-in local launcher, on the same machine, alternating (local, ray, local, ray ...).

The Ray side is a real three-node cluster on this machine (``ray.cluster_utils.Cluster``: a head
labelled ``trainer``, worker nodes labelled ``engine`` and ``rollout``) with each role pinned to its
node, as in ``nox -s ray``; started once, before the first run, and not counted. Per run it
measures, from the launch of ``relayrl run``:

* **start-up**: to the trainer's first RL step (both launchers do the same warm-up and weight
  publishing; the difference is placing actors and starting processes in them);
* **steps/s**: RL steps per second between the first and the last step (supervision polls each
  actor over Ray instead of ``waitpid``);
* **wall**: to the end of the run.

It prints the medians per launcher and the ratios ray/local. When it can, it runs itself in a network
namespace of its own (``unshare --net``) so that every Ray node is on loopback, as the tests do.

    python benchmarks/launcher_overhead.py              # 40 steps, 3 runs per launcher
    python benchmarks/launcher_overhead.py --quick      # a smoke run: 4 steps, 1 run each, nothing written
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--no-report", "--set", "trainer.warmup.steps=3", "--set", "rollout.environment_options.tasks=500",
        "--set", "buffer.batch_groups=2", "--set", "rollout.skip_zero_variance=false",
        "--set", "buffer.admission=['staleness']"]
ROLES = ('{ trainer = { num_cpus = 1, resources = { trainer = 1 } }, engine = { num_cpus = 1, resources = '
         '{ engine = 1 } }, rollout = { num_cpus = 1, resources = { rollout = 1 } } }')
PRIVATE_ENV = "RELAYRL_BENCH_PRIVATE_NET"


def only_loopback() -> bool:
    return {name for _, name in socket.if_nameindex()} <= {"lo"}


def rerun_in_private_network() -> None:
    """Re-execute this script inside ``unshare --net`` (loopback only) when that is allowed."""
    if only_loopback() or os.environ.get(PRIVATE_ENV):
        return
    probe = subprocess.run(["unshare", "--net", "--fork", "--", "true"], capture_output=True)
    if probe.returncode != 0:
        print("cannot make a network namespace here (needs root or user namespaces): Ray's nodes advertise this "
              "machine's address", flush=True)
        return
    command = " ".join(shlex.quote(arg) for arg in [sys.executable, *sys.argv])
    os.environ[PRIVATE_ENV] = "1"
    os.execvp("unshare", ["unshare", "--net", "--fork", "--", "sh", "-c", f"ip link set lo up && exec {command}"])


def one_run(run_dir: Path, steps: int, extra: list[str]) -> dict[str, float]:
    from relayrl.cli.run.ledger import verify_run
    from relayrl.trainer.metrics import read_metrics

    started = time.time()
    run = subprocess.run([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                          "--run-dir", str(run_dir), "--steps", str(steps), *ARGS, *extra],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=1200)
    wall = time.time() - started
    if run.returncode != 0:
        raise SystemExit(f"relayrl run {' '.join(extra)} failed:\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    check = verify_run(run_dir)
    if not check.ok:
        raise SystemExit(f"ledger audit failed: {check.errors[:3]}")
    times = [record["time"] for record in read_metrics(run_dir)]
    return {"startup_s": times[0] - started, "steps_per_s": (len(times) - 1) / max(times[-1] - times[0], 1e-9),
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 steps, one run per launcher, nothing written")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    steps, repeats = (4, 1) if args.quick else (args.steps, args.repeats)
    rerun_in_private_network()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    revision = commit()
    print(f"# launcher overhead: the quickstart, {steps} steps, {repeats} run(s) per launcher, alternating; "
          f"python {platform.python_version()}, {os.cpu_count()} cores", flush=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trainer": 2}})
    cluster.add_node(num_cpus=2, resources={"engine": 1})
    cluster.add_node(num_cpus=2, resources={"rollout": 1})
    cluster.wait_for_nodes()
    launchers = {"local": [], "ray": ["--launcher", "ray", "--set", f"launcher.options.address=\"{cluster.address}\"",
                                      "--set", f"launcher.options.roles={ROLES}"]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in launchers}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for repeat in range(repeats):
                for name, extra in launchers.items():
                    result = one_run(Path(scratch) / f"{name}-{repeat}", steps, extra)
                    results[name].append(result)
                    print(f"{name} run {repeat + 1}: start-up {result['startup_s']:.1f} s, "
                          f"{result['steps_per_s']:.2f} steps/s, wall {result['wall_s']:.1f} s", flush=True)
    finally:
        cluster.shutdown()

    def median(name: str, key: str) -> float:
        return statistics.median(result[key] for result in results[name])

    lines = [f"The quickstart for {steps} steps (3 warm-up steps), {repeats} run(s) per launcher alternating, the "
             "Ray cluster three nodes on this machine with the trainer, the engine and the rollout manager each on "
             f"its own; python {platform.python_version()}, {os.cpu_count()} cores:", "",
             "| launcher | start-up to the first step (s) | RL steps/s | wall (s) |", "|---|---|---|---|"]
    for name in launchers:
        lines.append(f"| {name} | {median(name, 'startup_s'):.1f} | {median(name, 'steps_per_s'):.2f} | "
                     f"{median(name, 'wall_s'):.1f} |")
    lines += ["", "(medians)", f"ray/local: start-up {median('ray', 'startup_s') / median('local', 'startup_s'):.2f}x, "
              f"steps/s {median('ray', 'steps_per_s') / median('local', 'steps_per_s'):.2f}x, "
              f"wall {median('ray', 'wall_s') / median('local', 'wall_s'):.2f}x. Every run's ledger verified."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("launcher_overhead", command=command_line(), markdown=markdown, data=results,
                             revision=revision)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
