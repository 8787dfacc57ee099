"""Sandbox benchmark: tool-call latency and throughput per backend, against a bare subprocess.

Every row runs the same tool call, ``bash -c 'echo hi'``:

* ``bare subprocess (baseline)``: ``subprocess.run`` with no isolation at all, in the same run;
* one row per installed sandbox backend that can start on this host (``process``, ``bwrap`` ...),
  through :class:`relayrl.sandbox.tools.ToolBox`, i.e. exactly what an agent's tool call costs.

Columns: latency p50 and p95 of serial calls, calls/s serial, calls/s for turns of 8 concurrent
calls (the agent loop's default), and the cost of creating + closing a sandbox (copy, tmpfs mount,
cgroups, uid). A last section grades 8 answers to one shipped task the way the grader does (the
gold solution's two runs that make the checks on generated inputs, once per group; a fresh grading
sandbox per answer; the split runner's two processes; signed records) against the bare baseline of
the same work: the hidden tests run by ``python3 -m unittest`` in a subprocess on a patched copy,
without any isolation or evidence; the ratio is what an unforgeable verdict costs.

    python benchmarks/sandbox.py            # 200 calls per row (run as root for full isolation)
    python benchmarks/sandbox.py --quick    # 20 calls, a CI smoke run

Ratios to the baseline are what to read; absolute times vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(call, calls: int, parallel_turns: int, run_turn) -> dict[str, float]:
    call()  # warm caches (binaries, page cache) before timing
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(parallel_turns):
        run_turn()
    parallel_seconds = time.perf_counter() - start
    return {"p50": percentile(latencies, 0.5) * 1e3, "p95": percentile(latencies, 0.95) * 1e3,
            "serial": calls / sum(latencies), "parallel": 8 * parallel_turns / parallel_seconds}


def bare_row(calls: int, turns: int) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    def call() -> None:
        subprocess.run(["/bin/bash", "-c", "echo hi"], capture_output=True, check=True)

    def turn() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: call(), range(8)))

    return measure(call, calls, turns, turn)


def backend_row(backend, seed: Path, calls: int, turns: int) -> dict[str, float]:
    from relayrl.core.wire import ToolCall
    from relayrl.sandbox.tools import ToolBox

    creations = []
    for _ in range(max(3, calls // 10)):
        start = time.perf_counter()
        backend.create(seed).close()
        creations.append(time.perf_counter() - start)
    with backend.create(seed) as sandbox:
        toolbox = ToolBox(sandbox)
        one = ToolCall(id="0", name="bash", arguments={"command": "echo hi"})
        batch = [ToolCall(id=str(index), name="bash", arguments={"command": "echo hi"}) for index in range(8)]

        def call() -> None:
            result = toolbox.run(one)
            assert result.output == "hi\n", result

        def turn() -> None:
            for result in toolbox.run_turn(batch):
                assert result.output == "hi\n", result

        row = measure(call, calls, turns, turn)
    row["create"] = statistics.median(creations) * 1e3
    return row


def grading_rows(backend, answers: int) -> tuple[float, float]:
    """Seconds to grade ``answers`` gold patches: the bare unittest baseline, then the grader."""
    import shutil

    from relayrl.environments.bugfix import shipped_tasks
    from relayrl.sandbox.grading import Grader
    from relayrl.sandbox.local import BASE_ENV
    from relayrl.sandbox.workspace import apply_patch_locally, prepare_workspace

    task = next(task for task in shipped_tasks() if task.task_id == "median")
    python = shutil.which("python3", path=BASE_ENV["PATH"]) or "python3"  # the interpreter sandboxes run
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-bare-") as temp:
        patched = Path(temp) / "patched"  # the host's work, once (the grader prepares once per group too)
        prepare_workspace(task, patched)
        apply_patch_locally(patched, task.gold_patch)
        shutil.copytree(task.hidden_tests, patched, dirs_exist_ok=True)
        start = time.perf_counter()
        for index in range(answers):  # per answer: a fresh copy of the tree, the tests in a subprocess
            tree = shutil.copytree(patched, Path(temp) / f"answer-{index}")
            subprocess.run([python, "-m", "unittest", "discover", "-s", "tests", "-t", "."], cwd=tree, check=True,
                           capture_output=True)
        bare = time.perf_counter() - start
    grader = Grader(backend)
    start = time.perf_counter()
    reports = grader.grade_group(task, [task.gold_patch] * answers)
    graded = time.perf_counter() - start
    assert all(report.passed and report.verdict == "split" for report in reports), reports[0]
    return bare, graded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 calls per row: a smoke run")
    parser.add_argument("--calls", type=int, default=None)
    args = parser.parse_args()
    calls = args.calls or (20 if args.quick else 200)
    turns = max(2, calls // 8)
    revision = commit()

    from relayrl.sandbox.api import Limits, SandboxUnavailable
    from relayrl.sandbox.hookspecs import SANDBOX_BACKENDS

    setup = (f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores, "
             f"{'root' if os.geteuid() == 0 else 'not root'}; {calls} serial calls and {turns} turns of 8 concurrent "
             "calls per row; tool call: `bash -c 'echo hi'`")
    print(setup)
    rows = {"bare subprocess (baseline)": bare_row(calls, turns)}
    available = {}
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-") as temp:
        seed = Path(temp) / "seed"
        (seed / "pkg").mkdir(parents=True)
        for index in range(20):
            (seed / "pkg" / f"module_{index}.py").write_text(f"VALUE = {index}\n" * 50)
        for name, record in SANDBOX_BACKENDS.registrations().items():
            try:
                backend = record.factory(limits=Limits(wall_time_s=30), require=[], network="none", root=None)
            except SandboxUnavailable as exc:
                print(f"skipping backend {name!r}: {exc}")
                continue
            available[name] = backend
            rows[f"{name} ({len(backend.capabilities())}/8 isolation properties)"] = backend_row(backend, seed, calls, turns)

    baseline = rows["bare subprocess (baseline)"]["p50"]
    lines = [setup + ":", "", "| backend | p50 ms | p95 ms | p50 x baseline | calls/s | 8-parallel calls/s "
             "| create + close ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        create = f"{row['create']:.1f}" if "create" in row else "-"
        lines.append(f"| {name} | {row['p50']:.2f} | {row['p95']:.2f} | {row['p50'] / baseline:.1f} | "
                     f"{row['serial']:.0f} | {row['parallel']:.0f} | {create} |")
    answers = 4 if args.quick else 8
    lines += ["", f"Grading {answers} answers to one shipped task: the bare baseline runs the hidden tests with "
              "`python3 -m unittest` on a patched copy, no isolation or evidence; the grader runs the gold solution twice "
              "per group (checks on generated inputs), then gives each answer a fresh sandbox, the split runner (the "
              "tests and the answer in two processes) and signed records.", "",
              "| backend | bare unittest ms per answer | grader ms per answer | grader / bare |", "|---|---:|---:|---:|"]
    grading = {}
    for name, backend in available.items():
        bare, graded = grading_rows(backend, answers)
        grading[name] = {"bare_s": bare / answers, "graded_s": graded / answers}
        lines.append(f"| {name} | {bare / answers * 1e3:.0f} | {graded / answers * 1e3:.0f} | {graded / bare:.2f}x |")
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("sandbox", command=command_line(), markdown=markdown, revision=revision,
                             data={"calls": rows, "grading": grading})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
