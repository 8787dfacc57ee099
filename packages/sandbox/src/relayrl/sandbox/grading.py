"""The grader: applies an answer to a fresh pristine copy in its own sandbox, which alone holds the tests.

The agent's sandbox never contains hidden tests or grader code; the agent hands in a diff
(:func:`relayrl.sandbox.workspace.workspace_diff`), nothing else. For a group of answers to one
task, one grading sandbox is created and each answer is graded in turn in it:

1. the host replaces ``run/`` with a copy of the pristine tree owned by the sandbox's uid, then
   copies the hidden tests in, **root-owned** with root-owned directories, so the answer's code
   cannot edit, delete or add files next to them;
2. one command applies the diff (``git apply``; a diff touching the tests fails here) and runs the
   task's grading command. Every command kills its whole process tree when it returns, so nothing
   an answer started is alive while the next answer is graded.

Reward is 1.0 when the grading command exits 0, else 0.0; exploit detectors then set it to 0 for
any cheating attempt (:meth:`Grader.grade_trajectories`). Creating one sandbox per group rather
than per answer is the batching the budget asks for (ENVIRONMENT.md: a sandbox per sample costs
more than the model); the per-answer commands are the isolation unit.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.wire import TaskSpec, Trajectory
from relayrl.sandbox.api import SandboxBackend, SandboxError
from relayrl.sandbox.config import SandboxSection
from relayrl.sandbox.detectors import DetectionContext, apply_flags, run_detectors
from relayrl.sandbox.local import LocalSandbox
from relayrl.sandbox.paths import walk_beneath, write_beneath
from relayrl.sandbox.workspace import hidden_test_paths, prepare_workspace

__all__ = ["GradeReport", "Grader"]

_OUTPUT_TAIL = 4000
_APPLY_FAILED = "relayrl-grader: the diff of the answer does not apply"


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
        """Grade several answers to one task in one grading sandbox, in order."""
        if not task.grading_command:
            raise SandboxError(f"task {task.task_id}: no grading_command")
        with tempfile.TemporaryDirectory(prefix="relayrl-pristine-") as temp:
            pristine = self.pristine(task, Path(temp) / "tree")
            shutil.rmtree(pristine / ".git", ignore_errors=True)
            with self.backend.create() as sandbox:
                return [self._grade_one(sandbox, task, pristine, diff, index) for index, diff in enumerate(diffs)]

    def _grade_one(self, sandbox: Any, task: TaskSpec, pristine: Path, diff: str, index: int) -> GradeReport:
        workdir = Path(sandbox.workdir)
        _clear(workdir)  # whatever the previous answer left (symlinks included) goes, unfollowed
        run = workdir / "run"
        shutil.copytree(pristine, run, symlinks=True)
        owner = getattr(sandbox, "owner", None)
        if isinstance(sandbox, LocalSandbox) and sandbox.uid is not None and owner:
            os.lchown(run, *owner)
            for relative, _ in walk_beneath(str(run)):
                os.lchown(run / relative, *owner)
        self._place_hidden_tests(task, run)
        patch_name = f".answer-{index}.diff"
        write_beneath(str(workdir), patch_name, diff.encode())  # root-owned: the answer can read, not edit, it
        # One command per answer: apply, then grade. The marker is printed before any of the
        # answer's code runs; an answer printing it itself can only turn its own pass into a failure.
        apply = (f"git apply --whitespace=nowarn ../{patch_name} || {{ echo {_APPLY_FAILED} >&2; exit 1; }}\n"
                 if diff.strip() else "")
        result = sandbox.exec(apply + task.grading_command, cwd="run", timeout=self.section.grading_timeout_s,
                              env={"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"})
        output = result.output[-_OUTPUT_TAIL:]
        if result.exit_status != 0 and result.stderr.rstrip().endswith(_APPLY_FAILED):
            return GradeReport(reward=0.0, applied=False, passed=False, exit_status=result.exit_status, output=output,
                               wall_time_s=result.wall_time_s, error="the answer's diff does not apply to the pristine workspace")
        passed = result.exit_status == 0 and not result.timed_out
        return GradeReport(reward=1.0 if passed else 0.0, applied=True, passed=passed, exit_status=result.exit_status,
                           output=output, wall_time_s=result.wall_time_s, timed_out=result.timed_out)

    @staticmethod
    def _place_hidden_tests(task: TaskSpec, run: Path) -> None:
        """Copy the hidden tests into ``run`` as root-owned files in root-owned directories."""
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
        ``reward_components["success"]``.
        """
        reports = self.grade_group(task, [diff for _, diff in answers])
        hidden = self.hidden_test_sources(task)
        graded = []
        for (trajectory, diff), report in zip(answers, reports):
            scored = msgspec.structs.replace(trajectory, reward=report.reward,
                                             reward_components={**trajectory.reward_components, "success": report.reward})
            context = DetectionContext.from_trajectory(scored, task, diff=diff, hidden_tests=hidden,
                                                       reference_globs=self.section.reference_globs)
            graded.append(apply_flags(scored, run_detectors(context, self.section.detectors, pm=self.pm)))
        return graded


def _clear(directory: Path) -> None:
    for entry in list(directory.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
