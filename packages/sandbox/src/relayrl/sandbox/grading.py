"""The grader: applies an answer to a fresh pristine copy in a sandbox of its own, which alone runs the tests.

The agent's sandbox never contains hidden tests or grader code; the agent hands in a diff
(:func:`relayrl.sandbox.workspace.workspace_diff`), nothing else. Each answer is graded **as if
alone**, in a new grading sandbox (fresh workspace, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``HOME``,
IPC objects, processes), with the task's whole folder and the backend's hidden paths masked:

1. the host copies the pristine tree into ``run/`` (owned by the sandbox's uid) and places the
   hidden tests' *other* files (data, helpers) there root-owned in root-owned directories;
2. one command applies the diff (``git apply``; a diff touching the tests fails here) and then runs
   the verdict:

   * **evidence** (tasks whose hidden tests include Python test modules): the grading runner
     (:mod:`relayrl.sandbox.grading_runner`) gets the hidden test modules' source, the inventory of
     expected tests and a per-answer key on stdin (the modules never touch the sandbox's disk), runs
     every expected test and reports signed records; :func:`relayrl.sandbox.evidence.verify_records`
     pays 1.0 only when every expected test ran once and passed and nothing was flagged;
   * **exit-status** (other tasks): reward 1.0 when the task's grading command exits 0. Weaker:
     an answer that can make the command exit 0 is paid; prefer hidden tests the runner can load.

Exploit detectors then set the reward to 0 for any cheating attempt, the runner's runtime flags
included (:meth:`Grader.grade_trajectories`). A sandbox per answer costs one creation (tens of
milliseconds, ``benchmarks/sandbox.py``) next to a Python start and the tests.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.wire import CheatingFlag, TaskSpec, Trajectory
from relayrl.sandbox.api import SandboxBackend, SandboxError
from relayrl.sandbox.config import SandboxSection
from relayrl.sandbox.detectors import DetectionContext, apply_flags, run_detectors
from relayrl.sandbox.evidence import (
    RUNNER_SOURCE,
    is_test_module,
    new_key,
    runner_payload,
    test_inventory,
    verify_records,
)
from relayrl.sandbox.local import BASE_ENV, LocalSandbox
from relayrl.sandbox.paths import walk_beneath, write_beneath
from relayrl.sandbox.workspace import hidden_test_paths, prepare_workspace, task_private_paths

__all__ = ["GradeReport", "Grader"]

_OUTPUT_TAIL = 4000
_APPLY_FAILED = "relayrl-grader: the diff of the answer does not apply"
_RUNNER = ".relayrl-grading-runner.py"
_PYTHON = ".relayrl-python"


@functools.lru_cache(maxsize=1)
def _sandbox_python() -> str | None:
    """The real ``python3`` binary sandboxes run (an ELF file), or None if it cannot be copied."""
    found = shutil.which("python3", path=BASE_ENV["PATH"])
    if found is None:
        return None
    binary = os.path.realpath(found)
    try:
        with open(binary, "rb") as handle:
            return binary if handle.read(4) == b"\x7fELF" else None
    except OSError:
        return None


@dataclasses.dataclass(frozen=True)
class GradeReport:
    """The grader's verdict on one answer."""

    reward: float
    applied: bool
    passed: bool
    exit_status: int | None = None
    output: str = ""
    """Tail of the grading command's output (for humans; never shown to the policy)."""
    wall_time_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    verdict: str = "exit-status"
    """``evidence`` (signed per-test records) or ``exit-status`` (the grading command's exit status)."""
    tests_expected: int = 0
    tests_passed: int = 0
    flags: tuple[CheatingFlag, ...] = ()
    """Cheating seen while grading (runtime flags, forged records); any flag makes the reward 0."""
    protections: str = ""
    """What the grading runner could set up (``non-dumpable``), comma-separated; evidence verdicts only."""


class Grader:
    """Grades answers (diffs) to tasks in sandboxes of ``backend``; see the module docstring."""

    def __init__(self, backend: SandboxBackend, *, section: SandboxSection | None = None, pm: Any = None) -> None:
        self.backend = backend
        self.section = section or SandboxSection()
        self.pm = pm

    def pristine(self, task: TaskSpec, directory: str | Path) -> Path:
        """Prepare the task's pristine tree (what the agent started from) in ``directory``."""
        prepare_workspace(task, directory, reference_globs=self.section.reference_globs)
        return Path(directory)

    def grade(self, task: TaskSpec, diff: str) -> GradeReport:
        """Grade one answer."""
        return self.grade_group(task, [diff])[0]

    def grade_group(self, task: TaskSpec, diffs: Sequence[str]) -> list[GradeReport]:
        """Grade several answers to one task, each in a grading sandbox of its own, in order."""
        modules = self.hidden_test_modules(task)
        if not task.grading_command and not modules:
            raise SandboxError(f"task {task.task_id}: no grading_command and no hidden Python test module")
        inventory = test_inventory(modules) if modules else []
        with tempfile.TemporaryDirectory(prefix="relayrl-pristine-") as temp:
            pristine = self.pristine(task, Path(temp) / "tree")
            shutil.rmtree(pristine / ".git", ignore_errors=True)
            reports = []
            for diff in diffs:
                with self.backend.create(hide=task_private_paths(task)) as sandbox:
                    reports.append(self._grade_one(sandbox, task, pristine, diff, modules, inventory))
            return reports

    def hidden_test_modules(self, task: TaskSpec) -> dict[str, str]:
        """The hidden Python test modules (path -> source) the grading runner loads from memory."""
        if not task.hidden_tests:
            return {}
        root = Path(task.hidden_tests)
        return {path: (root / path).read_text(encoding="utf-8") for path in hidden_test_paths(task)
                if is_test_module(path)}

    def _grade_one(self, sandbox: Any, task: TaskSpec, pristine: Path, diff: str, modules: dict[str, str],
                   inventory: list[str]) -> GradeReport:
        workdir = Path(sandbox.workdir)
        run = workdir / "run"
        shutil.copytree(pristine, run, symlinks=True)
        owner = getattr(sandbox, "owner", None)
        if isinstance(sandbox, LocalSandbox) and sandbox.uid is not None and owner:
            os.lchown(run, *owner)
            for relative, _ in walk_beneath(str(run)):
                os.lchown(run / relative, *owner)
        self._place_hidden_tests(task, run, skip=set(modules))
        write_beneath(str(workdir), ".answer.diff", diff.encode())  # root-owned: the answer can read, not edit, it
        # One command per answer: apply, then grade. The marker is printed before any of the
        # answer's code runs; an answer printing it itself can only turn its own pass into a failure.
        apply = (f"git apply --whitespace=nowarn ../.answer.diff </dev/null || {{ echo {_APPLY_FAILED} >&2; exit 1; }}\n"
                 if diff.strip() else "")
        key = new_key() if modules else b""
        if modules:
            write_beneath(str(workdir), _RUNNER, RUNNER_SOURCE.encode())  # root-owned, read-only for the answer
            command, stdin = f"exec {self._runner_python(workdir)} -I -B ../{_RUNNER}", runner_payload(
                key=key, root=str(run), modules=modules, inventory=inventory)
        else:
            command, stdin = task.grading_command, None
        result = sandbox.exec(apply + command, cwd="run", timeout=self.section.grading_timeout_s, stdin=stdin,
                              env={"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"})
        if result.exit_status != 0 and result.stderr.rstrip().endswith(_APPLY_FAILED):
            return GradeReport(reward=0.0, applied=False, passed=False, exit_status=result.exit_status,
                               output=result.output[-_OUTPUT_TAIL:], wall_time_s=result.wall_time_s,
                               error="the answer's diff does not apply to the pristine workspace",
                               verdict="evidence" if modules else "exit-status", tests_expected=len(inventory))
        if not modules:
            passed = result.exit_status == 0 and not result.timed_out
            return GradeReport(reward=1.0 if passed else 0.0, applied=True, passed=passed,
                               exit_status=result.exit_status, output=result.output[-_OUTPUT_TAIL:],
                               wall_time_s=result.wall_time_s, timed_out=result.timed_out)
        evidence = verify_records(result.stdout, key=key, inventory=inventory)
        if result.timed_out:
            evidence.problems.append("the grading timed out")
        passed = evidence.passed and not result.timed_out
        # Humans read the tests' output (stderr) and the verdict's reasons; the records stay on the host.
        output = (result.stderr[-_OUTPUT_TAIL:] + "".join(f"\n[grader] {problem}" for problem in evidence.problems[:20]))
        flags = tuple(CheatingFlag(detector=detector, evidence=text) for detector, text in evidence.flags)
        return GradeReport(reward=1.0 if passed else 0.0, applied=True, passed=passed, exit_status=result.exit_status,
                           output=output, wall_time_s=result.wall_time_s, timed_out=result.timed_out,
                           error=None if passed else (evidence.problems or ["flagged"])[0], verdict="evidence",
                           tests_expected=len(inventory), tests_passed=evidence.tests_passed, flags=flags,
                           protections=evidence.protections)

    @staticmethod
    def _runner_python(workdir: Path) -> str:
        """An execute-only copy of the sandbox's python3: the kernel makes a process started from a
        file it cannot read non-dumpable, so nothing else in the sandbox can ptrace the runner or read
        its memory (its key). Falls back to ``python3`` (the runner then reports the protection missing)."""
        binary = _sandbox_python()
        if binary is None:
            return "python3"
        target = workdir / _PYTHON
        try:
            shutil.copyfile(binary, target)
            target.chmod(0o111)
        except OSError:
            return "python3"
        return f"../{_PYTHON}"

    @staticmethod
    def _place_hidden_tests(task: TaskSpec, run: Path, *, skip: set[str] = frozenset()) -> None:
        """Copy the hidden tests into ``run`` as root-owned files in root-owned directories (``skip``: empty)."""
        if not task.hidden_tests:
            return
        source = Path(task.hidden_tests)
        for relative in hidden_test_paths(task):
            target = run / relative
            parent = run
            for part in Path(relative).parts[:-1]:
                parent = parent / part
                if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                    raise SandboxError(f"{parent}: not a directory in the pristine tree")
                parent.mkdir(exist_ok=True)
                if os.geteuid() == 0:
                    os.lchown(parent, 0, 0)
                parent.chmod(0o755)
            if target.is_symlink() or target.exists():
                target.unlink()
            if relative in skip:
                target.touch()  # an empty placeholder: the runner has the source; a diff creating it fails
            else:
                shutil.copyfile(source / relative, target, follow_symlinks=False)
            target.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)

    # ------------------------------------------------------------------------------ trajectories
    def hidden_test_sources(self, task: TaskSpec) -> dict[str, str]:
        if not task.hidden_tests:
            return {}
        root = Path(task.hidden_tests)
        return {path: (root / path).read_text(errors="replace") for path in hidden_test_paths(task)}

    def grade_trajectories(self, task: TaskSpec, answers: Sequence[tuple[Trajectory, str]]) -> list[Trajectory]:
        """Reward each ``(trajectory, final diff)`` and run the detectors; flagged ones get reward 0.

        The evidence is kept on the trajectory (``cheating``); the grade is kept in
        ``reward_components["success"]``, the grader's report in ``metrics`` (``grade/...``: whether
        the diff applied, tests expected and passed, grading seconds).
        """
        reports = self.grade_group(task, [diff for _, diff in answers])
        hidden = self.hidden_test_sources(task)
        graded = []
        for (trajectory, diff), report in zip(answers, reports):
            grade = {"grade/applied": float(report.applied), "grade/tests_expected": float(report.tests_expected),
                     "grade/tests_passed": float(report.tests_passed), "grade/wall_time_s": report.wall_time_s}
            scored = msgspec.structs.replace(trajectory, reward=report.reward,
                                             reward_components={**trajectory.reward_components, "success": report.reward},
                                             metrics={**trajectory.metrics, **grade})
            context = DetectionContext.from_trajectory(scored, task, diff=diff, hidden_tests=hidden,
                                                       reference_globs=self.section.reference_globs)
            flags = [*report.flags, *run_detectors(context, self.section.detectors, pm=self.pm)]
            graded.append(apply_flags(scored, flags))
        return graded
