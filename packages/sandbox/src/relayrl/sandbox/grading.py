"""The grader: applies an answer to a fresh pristine copy in a sandbox of its own, which alone runs the tests.

The agent's sandbox never contains hidden tests or grader code; the agent hands in a diff
(:func:`relayrl.sandbox.workspace.workspace_diff`), nothing else. Each answer is graded **as if
alone**, in a new grading sandbox (fresh workspace, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``HOME``,
IPC objects, processes), with the task's whole folder and the backend's hidden paths masked:

1. the host copies the pristine tree into ``run/`` (owned by the sandbox's uid) and places the
   hidden tests' *other* files (data) there root-owned in root-owned directories;
2. one command applies the diff (``git apply``; a diff touching the tests fails here) and then runs
   the verdict, one of :data:`VERDICTS`:

   * ``split`` (tasks whose hidden tests include Python test modules; the default): the split
     runner (:mod:`relayrl.sandbox.split_runner`) runs the hidden tests in a trusted, non-dumpable
     driver process and the answer's code in a worker process, which answers with plain data
     only; comparisons, the expected values and the signed records stay in the driver;
   * ``in-process`` (``metadata["grading"] = "in-process"``: suites that need the answer's objects
     in the tests' own process): the in-process runner (:mod:`relayrl.sandbox.grading_runner`)
     runs the tests beside the answer, defended by audit hooks and rewritten comparisons;
   * ``exit-status`` (no hidden Python test module): reward 1.0 when the task's grading command
     exits 0; an answer that can make the command exit 0 is paid.

   Both runners get the hidden test modules' source, the inventory of expected tests and a
   per-answer key on stdin (the modules never touch the sandbox's disk) and report signed records;
   :func:`relayrl.sandbox.evidence.verify_records` pays 1.0 only when every expected test ran once
   and passed, nothing was flagged and the runner was non-dumpable.

Exploit detectors then set the reward to 0 for any cheating attempt, the runner's runtime flags
included (:meth:`Grader.grade_trajectories`). Each trajectory records how its reward was judged
(``grade/isolation``: 2 split, 1 in-process, 0 exit-status). A sandbox per answer costs one
creation (milliseconds, ``benchmarks/sandbox.py``) next to a Python start and the tests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import secrets
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.plugins import PluginManager
from relayrl.core.wire import CheatingFlag, TaskSpec, Trajectory
from relayrl.sandbox.api import ExecResult, SandboxBackend, SandboxError
from relayrl.sandbox.config import SandboxSection
from relayrl.sandbox.detectors import DetectionContext, apply_flags, run_detectors
from relayrl.sandbox.evidence import (
    RUNNER_SOURCE,
    SPLIT_RUNNER_SOURCE,
    is_test_module,
    new_key,
    read_records,
    runner_payload,
    test_inventory,
    verify_records,
)
from relayrl.sandbox.local import LocalSandbox
from relayrl.sandbox.paths import walk_beneath, write_beneath
from relayrl.sandbox.probes import variations
from relayrl.sandbox.workspace import apply_patch_locally, hidden_test_paths, prepare_workspace, task_private_paths

__all__ = ["TEST_TIMEOUT_S", "VERDICTS", "GradeReport", "Grader", "verdict_for"]

logger = logging.getLogger(__name__)

_OUTPUT_TAIL = 4000
_APPLY_FAILED = "relayrl-grader: the diff of the answer does not apply"
_RUNNERS = {"split": (".relayrl-split-runner.py", SPLIT_RUNNER_SOURCE),
            "in-process": (".relayrl-grading-runner.py", RUNNER_SOURCE)}

VERDICTS = {"split": 2.0, "in-process": 1.0, "exit-status": 0.0}
"""How an answer can be judged, strongest first, with the ``grade/isolation`` each records."""
TEST_TIMEOUT_S = 30.0
"""The most one hidden test (or one test class, per test) may take in the split runner."""


def _top_level_modules(tree: Path) -> list[str]:
    """The importable top-level names of a pristine tree (packages, namespace folders, modules)."""
    names = set()
    for entry in tree.iterdir():
        if entry.name.startswith(".") or entry.is_symlink():
            continue
        if entry.is_dir() and entry.name.isidentifier():
            names.add(entry.name)
        elif entry.suffix == ".py" and entry.stem.isidentifier():
            names.add(entry.stem)
    return sorted(names)


def verdict_for(task: TaskSpec, has_test_modules: bool) -> str:
    """The verdict of ``task`` (see the module docstring); a bad ``metadata["grading"]`` is named in one line."""
    if not has_test_modules:
        return "exit-status"
    chosen = task.metadata.get("grading", "split")
    if chosen not in ("split", "in-process"):
        raise SandboxError(f'task {task.task_id}: metadata.grading must be "split" or "in-process", got {chosen!r}')
    return str(chosen)


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
    """One of :data:`VERDICTS`: ``split`` or ``in-process`` (signed per-test records), ``exit-status``."""
    tests_expected: int = 0
    tests_passed: int = 0
    flags: tuple[CheatingFlag, ...] = ()
    """Cheating seen while grading (runtime flags, forged records); any flag makes the reward 0."""
    protections: str = ""
    """What the grading runner set up (``non-dumpable``, ``split``), comma-separated; runner verdicts only."""
    checks: int = 0
    """Hidden checks on generated inputs among ``tests_expected`` (:mod:`relayrl.sandbox.probes`)."""


class Grader:
    """Grades answers (diffs) to tasks in sandboxes of ``backend``; see the module docstring."""

    def __init__(self, backend: SandboxBackend, *, section: SandboxSection | None = None, pm: PluginManager | None = None) -> None:
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
        tests = self.hidden_test_modules(task)
        if not task.grading_command and not tests:
            raise SandboxError(f"task {task.task_id}: no grading_command and no hidden Python test module")
        verdict = verdict_for(task, bool(tests))
        # The split runner loads the hidden tests' helper modules from the payload too, never from disk.
        modules = self.hidden_python_sources(task) if verdict == "split" else tests
        inventory = test_inventory(tests) if tests else []
        with tempfile.TemporaryDirectory(prefix="relayrl-pristine-") as temp:
            pristine = self.pristine(task, Path(temp) / "tree")
            shutil.rmtree(pristine / ".git", ignore_errors=True)
            checks = self.checks(task, pristine, modules, inventory) if verdict == "split" else []
            expected = [*inventory, *(f"relayrl.check.{index}" for index in range(len(checks)))]
            reports = []
            for diff in diffs:
                with self.backend.create(hide=task_private_paths(task)) as sandbox:
                    reports.append(self._grade_one(sandbox, task, pristine, diff, verdict, modules, expected,
                                                   checks=checks))
            return reports

    def checks(self, task: TaskSpec, pristine: Path, modules: dict[str, str], inventory: list[str]) -> list[Any]:
        """Hidden checks on generated inputs, answered by the gold solution (:mod:`relayrl.sandbox.probes`);
        none without a gold patch, with ``metadata["probes"] = false``, or when the gold solution fails."""
        if not task.gold_patch or task.metadata.get("probes", True) is False:
            return []
        with tempfile.TemporaryDirectory(prefix="relayrl-gold-") as temp:
            gold = Path(temp) / "tree"
            shutil.copytree(pristine, gold, symlinks=True)
            try:
                apply_patch_locally(gold, task.gold_patch)
            except SandboxError as error:  # a broken task: its answers are graded by the tests alone
                logger.warning("task %s: %s; no checks on generated inputs", task.task_id, error)
                return []
            recorded = self._gold_records(task, gold, modules, inventory, mode="record")
            results = [fields for fields in recorded if fields[0] == "result"]
            if len(results) != len(inventory) or any(fields[2] != "passed" for fields in results):
                logger.warning("task %s: the gold solution does not pass its hidden tests in the split runner; "
                               "no checks on generated inputs", task.task_id)
                return []
            calls = [(fields[1], *json.loads(fields[2])) for fields in recorded if fields[0] == "call"]
            probes = variations(calls, random.Random(secrets.randbits(64)))
            if not probes:
                return []
            answered = {int(fields[1]): fields[2] for fields in self._gold_records(
                task, gold, modules, [], mode="probe", probes=probes) if fields[0] == "probe"}
        kept = []
        for index, probe in enumerate(probes):
            outcome = json.loads(answered[index]) if answered.get(index, "unstable") != "unstable" else {}
            if "ok" in outcome:  # an input the gold solution refuses may be refused otherwise by a fix
                kept.append([*probe, outcome])
        return kept

    def _gold_records(self, task: TaskSpec, tree: Path, modules: dict[str, str], inventory: list[str],
                      **options: Any) -> list[tuple[str, ...]]:
        with self.backend.create(hide=task_private_paths(task)) as sandbox:
            result, key = self._execute(sandbox, task, tree, "", "split", modules, inventory, **options)
        return read_records(result.stdout, key=key)

    def hidden_test_modules(self, task: TaskSpec) -> dict[str, str]:
        """The hidden Python test modules (path -> source): what the inventory of expected tests comes from."""
        return {path: source for path, source in self.hidden_python_sources(task).items() if is_test_module(path)}

    def hidden_python_sources(self, task: TaskSpec) -> dict[str, str]:
        """Every Python file of the hidden tests (path -> source): test modules and their helpers."""
        if not task.hidden_tests:
            return {}
        root = Path(task.hidden_tests)
        return {path: (root / path).read_text(encoding="utf-8") for path in hidden_test_paths(task)
                if path.endswith(".py")}

    def _grade_one(self, sandbox: Any, task: TaskSpec, pristine: Path, diff: str, verdict: str,
                   modules: dict[str, str], inventory: list[str], **options: Any) -> GradeReport:
        result, key = self._execute(sandbox, task, pristine, diff, verdict, modules, inventory, **options)
        if result.exit_status != 0 and result.stderr.rstrip().endswith(_APPLY_FAILED):
            return GradeReport(reward=0.0, applied=False, passed=False, exit_status=result.exit_status,
                               output=result.output[-_OUTPUT_TAIL:], wall_time_s=result.wall_time_s,
                               error="the answer's diff does not apply to the pristine workspace",
                               verdict=verdict, tests_expected=len(inventory))
        if verdict == "exit-status":
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
                           error=None if passed else (evidence.problems or ["flagged"])[0], verdict=verdict,
                           tests_expected=len(inventory), tests_passed=evidence.tests_passed, flags=flags,
                           protections=evidence.protections,
                           checks=sum(test.startswith("relayrl.check.") for test in inventory))

    def _execute(self, sandbox: Any, task: TaskSpec, tree: Path, diff: str, verdict: str, modules: dict[str, str],
                 inventory: list[str], **options: Any) -> tuple[ExecResult, bytes]:
        """Run ``verdict`` on ``tree`` + ``diff`` in ``sandbox``: its result and the key of its records."""
        workdir = Path(sandbox.workdir)
        run = workdir / "run"
        shutil.copytree(tree, run, symlinks=True)
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
        key = new_key() if verdict != "exit-status" else b""
        if verdict != "exit-status":
            script, source = _RUNNERS[verdict]
            write_beneath(str(workdir), script, source.encode())  # root-owned, read-only for the answer
            if verdict == "split":
                options = {"python": "python3", "test_timeout_s": min(TEST_TIMEOUT_S, self.section.grading_timeout_s),
                           "repository": _top_level_modules(tree), **options}
            command, stdin = f"exec python3 -I -B ../{script}", runner_payload(
                key=key, root=str(run), modules=modules, inventory=inventory, **options)
        else:
            command, stdin = task.grading_command, None
        result = sandbox.exec(apply + command, cwd="run", timeout=self.section.grading_timeout_s, stdin=stdin,
                              env={"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"})
        return result, key

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
                     "grade/tests_passed": float(report.tests_passed), "grade/wall_time_s": report.wall_time_s,
                     "grade/isolation": VERDICTS[report.verdict], "grade/checks": float(report.checks)}
            scored = msgspec.structs.replace(trajectory, reward=report.reward,
                                             reward_components={**trajectory.reward_components, "success": report.reward},
                                             metrics={**trajectory.metrics, **grade})
            context = DetectionContext.from_trajectory(scored, task, diff=diff, hidden_tests=hidden,
                                                       reference_globs=self.section.reference_globs)
            flags = [*report.flags, *run_detectors(context, self.section.detectors, pm=self.pm)]
            graded.append(apply_flags(scored, flags))
        return graded
