"""Grading a kernel candidate: the in-sandbox harness, its report, and the reward.

:class:`KernelGrader` runs :mod:`relayrl.environments.kernels.harness` in a fresh sandbox of the run's
backend for every candidate (``python3 -I -c HARNESS harness``, the job as JSON on stdin); the
candidate's source is untrusted and never runs on the host. The interpreter is the sandbox's own
``python3`` (the distribution's, which the sandbox user can run: relayrl's own may live where that
user cannot read, e.g. under ``/root``), with NumPy from the distribution's packages (Debian:
``apt-get install python3-numpy``); :meth:`KernelGrader.check` says in one line when it is missing. The report says whether the candidate is correct on fresh inputs, its speed-up over
the reference (median of interleaved rounds, with the interquartile range of the per-round
ratios), and any exploit flags with their evidence.

The reward (:class:`KernelReward`, the shape of Kevin's: a correctness gate plus the speed-up): 0
for an incorrect or flagged candidate; otherwise ``correct`` plus ``speedup_weight`` times the
speed-up beyond 1, where a speed-up within the noise floor of 1 counts as exactly 1 and speed-ups
are capped at ``max_speedup``. A correct candidate no faster than the reference earns ``correct``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.plugins import PluginManager
from relayrl.environments.kernels.tasks import KernelTask

logger = logging.getLogger(__name__)

__all__ = ["KernelGrader", "KernelReport", "KernelReward", "harness_job", "harness_source"]


@functools.cache
def harness_source() -> str:
    """The harness script's text (it starts its workers from the same text)."""
    return (Path(__file__).parent / "harness.py").read_text()


class KernelReport(msgspec.Struct, kw_only=True):
    """What the harness found (see :mod:`relayrl.environments.kernels.harness`)."""

    status: str
    """``ok``, ``load_error``, ``incorrect``, ``runtime_error``, ``timeout``, ``crashed``, ``exploit``,
    ``grader_error``."""
    correct: bool = False
    speedup: float | None = None
    speedup_q1: float | None = None
    speedup_q3: float | None = None
    rounds: int = 0
    reference_call_s: float | None = None
    candidate_call_s: float | None = None
    disturbed_rounds: int = 0
    """Timed rounds whose reference ran far longer in wall time than on the CPU (stopped or preempted;
    on the CPU its time is its CPU time, so this is evidence, not an error)."""
    flags: list[dict[str, str]] = []
    message: str = ""
    stderr: str = ""

    def feedback(self) -> str:
        """The report as the agent reads it after a submission (compiler errors, correctness, timing)."""
        if self.status == "ok" and self.correct and self.speedup is not None:
            return (f"correct; speed-up {self.speedup:.2f}x over the reference (interquartile "
                    f"{self.speedup_q1:.2f}-{self.speedup_q3:.2f}, {self.rounds} rounds)")
        if self.status == "ok" and self.correct:
            return "correct"
        if self.status == "exploit":
            return "rejected: " + "; ".join(f"{flag['detector']}: {flag['evidence']}" for flag in self.flags)
        return f"{self.status}: {self.message}"[:2000]


class KernelReward(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The reward of a graded candidate (see the module docstring)."""

    correct: float = 0.3
    speedup_weight: float = 1.0
    noise_floor: float = 0.1
    """A speed-up within ``1 ± noise_floor`` counts as exactly 1: wider than the spread of an identical
    candidate graded repeatedly (``benchmarks/kernel_grader.py``)."""
    max_speedup: float = 10.0

    def __call__(self, report: KernelReport) -> float:
        if report.flags or not report.correct:
            return 0.0
        if report.speedup is None:  # graded for correctness alone
            return self.correct
        return self.correct + self.speedup_weight * max(0.0, self.effective_speedup(report.speedup) - 1.0)

    def effective_speedup(self, speedup: float) -> float:
        if not math.isfinite(speedup) or speedup <= 0:
            return 0.0
        if abs(speedup - 1.0) <= self.noise_floor:
            return 1.0
        return min(speedup, self.max_speedup)


def harness_job(task: KernelTask, candidate: str, *, rounds: int = 10, time_it: bool = True,
                timeout_s: float = 120.0, **extra: Any) -> dict[str, Any]:
    """The JSON job the harness grades."""
    return {"harness_source": harness_source(), "reference": task.reference, "candidate": candidate,
            "framework": task.framework, "args": msgspec.to_builtins(task.args), "sizes": task.sizes,
            "tolerance": msgspec.to_builtins(task.tolerance), "rounds": rounds, "time": time_it,
            "timeout_s": timeout_s, **extra}


class KernelGrader:
    """Grades candidates in fresh sandboxes of one backend (the run's ``[sandbox]`` section)."""

    def __init__(self, backend: Any = None, *, section: Any = None, pm: PluginManager | None = None, python: str = "python3",
                 device: str = "cpu") -> None:
        self.python = python
        self.device = device
        """Where PyTorch tasks run: ``cpu``, or ``cuda`` (NumPy tasks always run on the CPU)."""
        self._backend = backend
        self._section = section
        self._pm = pm
        self.graded = 0

    def backend(self) -> Any:
        if self._backend is None:
            from relayrl.sandbox import SandboxSection, open_backend

            section = self._section or SandboxSection()
            if self.device.startswith("cuda") and section.limits.address_space_bytes == 0:
                # CUDA reserves address space by the hundred GiB and fails to load under an address-space
                # limit near the sandbox's memory; the memory cgroup, where the host has one, bounds it.
                section = msgspec.structs.replace(
                    section, limits=msgspec.structs.replace(section.limits, address_space_bytes=-1))
            self._backend = open_backend(section=section, pm=self._pm)
            # A sandbox sees the system directories only: the interpreter (a virtual environment with
            # PyTorch, say) and, for a GPU, the device information its driver reads, are exposed.
            from relayrl.sandbox.view import interpreter_paths

            self._backend.expose([*interpreter_paths(self.python), *(["/sys"] if self.device.startswith("cuda") else [])])
            if self.device.startswith("cuda") and "memory-limit" not in self._backend.capabilities():
                logger.warning("kernel grader: no memory cgroup on this host and no address-space limit under "
                               "CUDA: a candidate's host memory is bounded by its CPU and wall time only")
        return self._backend

    def check(self, framework: str = "numpy") -> str | None:
        """None when the sandbox's interpreter can grade tasks of ``framework`` (it imports NumPy, and
        PyTorch with a working device for ``torch``); else why, in one line."""
        probe = "import numpy; print(numpy.__version__)"
        if framework == "torch":
            probe += f"; import torch; torch.ones(1, device={self.device!r}).sum().item()"
        with self.backend().create() as sandbox:
            result = sandbox.exec([self.python, "-I", "-c", probe], timeout=120)
        if result.exit_status == 0:
            return None
        if framework == "torch":
            return (f"kernel grader: `{self.python}` in the sandbox cannot run PyTorch on {self.device!r} (set "
                    f"`python` to an interpreter that has it, and a sandbox backend that can reach the device): "
                    f"{result.stderr.strip()[-200:]}")
        return (f"kernel grader: `{self.python}` in the sandbox cannot import NumPy (install the distribution's "
                f"package, e.g. `apt-get install python3-numpy`): {result.stderr.strip()[-200:]}")

    def grade(self, task: KernelTask, candidate: str, *, rounds: int = 10, time_it: bool = True,
              timeout_s: float = 120.0, **extra: Any) -> KernelReport:
        """Grade ``candidate`` (source defining ``kernel``) against ``task`` (blocking)."""
        job = harness_job(task, candidate, rounds=rounds, time_it=time_it, timeout_s=timeout_s,
                          **({"device": self.device} if task.framework == "torch" else {}), **extra)
        with self.backend().create() as sandbox:
            result = sandbox.exec([self.python, "-I", "-c", harness_source(), "harness"], stdin=json.dumps(job),
                                  timeout=timeout_s + 30)
        self.graded += 1
        try:
            return msgspec.convert(json.loads(result.stdout), KernelReport)
        except (ValueError, msgspec.ValidationError):
            return KernelReport(status="grader_error", message=f"the harness exited {result.exit_status}: "
                                                               f"{(result.stderr or result.stdout)[-1500:]}")
