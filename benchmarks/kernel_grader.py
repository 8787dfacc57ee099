"""The kernel grader's timing: is it unbiased, how noisy is it, and what do faster kernels earn?

For every shipped task, the reference is graded against itself (a candidate identical to the
reference: the honest answer is a speed-up of 1); for the tasks with a hand-written faster candidate
(``FAST`` in ``relayrl.environments.kernels.catalog``), that candidate is graded too. Each grading is
repeated; the table prints the median speed-up over repeats, its range, and the interquartile range
of per-round ratios inside one grading. Everything runs in the real sandbox and harness, timed
interleaved on one core: the numbers are ratios measured in the same sandbox, never absolute times.

    python benchmarks/kernel_grader.py            # every shipped task, 3 gradings each, 10 rounds
    python benchmarks/kernel_grader.py --quick    # 3 tasks, 1 grading, 3 rounds (a CI smoke run)

The PyTorch tasks (``relayrl.environments.kernels.torch_catalog``) take an interpreter with PyTorch that
the sandbox can run, and a device; their results are a file of their own:

    python benchmarks/kernel_grader.py --framework torch --python /var/cache/relayrl/kernel-torch-python/bin/python
    python benchmarks/kernel_grader.py --framework torch --device cuda --python "$(command -v python3)" \
        --backend process                         # on a GPU host (benchmarks/gpu/check.sh)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--framework", choices=["numpy", "torch"], default="numpy")
    parser.add_argument("--device", default="cpu", help="where PyTorch tasks run: cpu, cuda, cuda:N")
    parser.add_argument("--python", default="python3", help="the interpreter inside the sandbox")
    parser.add_argument("--backend", default=None, help="the sandbox backend (default: the strongest this host runs)")
    args = parser.parse_args()
    from relayrl.environments.kernels.catalog import FAST, shipped_tasks
    from relayrl.environments.kernels.grading import KernelGrader, KernelReward
    from relayrl.environments.kernels.torch_catalog import TORCH_FAST
    from relayrl.sandbox import SandboxSection

    section = SandboxSection(backend=args.backend) if args.backend else None
    grader = KernelGrader(section=section, python=args.python, device=args.device)
    reason = grader.check(args.framework)
    if reason:
        print(f"kernel_grader: skipped: {reason}")
        return 0
    shipped, fast = shipped_tasks(args.framework), {**FAST, **TORCH_FAST}
    quick = {"swish", "gelu_tanh", "diag_matmul", "torch_swish", "torch_gelu_tanh", "torch_diag_matmul"}
    tasks = [task for task in shipped if task.name in quick] if args.quick else shipped
    repeats, rounds = (1, 3) if args.quick else (args.repeats, args.rounds)
    revision = commit()
    where = ("the distribution's NumPy" if args.framework == "numpy" else
             f"PyTorch on `{args.device}` ({'the CPU: one pinned core, one thread' if args.device == 'cpu' else 'the GPU'})")
    lines = [f"Each task graded {repeats} time(s), {rounds} timing rounds per grading, in this machine's default "
             f"sandbox with {where}. *Median* is over gradings; *range* is the "
             f"lowest and highest grading; *IQR* is the interquartile range of per-round ratios within the "
             f"first grading.", "",
             "| task | candidate | median speed-up | range over gradings | IQR within a grading |",
             "|---|---|---:|---:|---:|"]
    data: dict[str, dict[str, list[float]]] = {}
    self_ratios = []
    for task in tasks:
        candidates = {"the reference itself": task.reference.replace("def reference", "def kernel")}
        if task.name in fast:
            candidates["hand-written (FAST)"] = fast[task.name]
        for label, source in candidates.items():
            reports = [grader.grade(task, source, rounds=rounds) for _ in range(repeats)]
            bad = [report for report in reports if not report.correct]
            if bad:
                print(f"{task.name} / {label}: {bad[0].status}: {bad[0].message}")
                return 1
            speedups = [report.speedup for report in reports]
            data.setdefault(task.name, {})[label] = speedups
            if label == "the reference itself":
                self_ratios += speedups
            first = reports[0]
            lines.append(f"| {task.name} | {label} | {statistics.median(speedups):.2f} | "
                         f"{min(speedups):.2f}-{max(speedups):.2f} | {first.speedup_q1:.2f}-{first.speedup_q3:.2f} |")
            print(lines[-1], flush=True)
    lines += ["", f"The reference against itself over all {len(self_ratios)} gradings: median "
                  f"{statistics.median(self_ratios):.3f}, range {min(self_ratios):.3f}-{max(self_ratios):.3f} "
                  f"(an unbiased grader centres on 1; the reward counts a speed-up within "
                  f"±{KernelReward().noise_floor} of 1 as exactly 1)."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        name = "kernel_grader" if args.framework == "numpy" else f"kernel_grader-torch-{args.device.split(':')[0]}"
        path = write_results(name, command=command_line(), markdown=markdown, data=data, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
