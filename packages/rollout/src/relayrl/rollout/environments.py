"""Code environments: an agent's tools in its own sandbox, its answer graded in an isolated one.

:class:`SandboxEnvironment` connects the agent loop and the rollout manager to relayrl-sandbox:

* ``tools(task)``: for one trajectory, prepare the task's workspace (history replaced, reference
  artifacts stripped), create a sandbox from it with the task's source and hidden tests masked
  (:func:`relayrl.sandbox.workspace.task_private_paths`, the grader's rule too), and yield a
  :class:`relayrl.sandbox.ToolBox` (the agent loop's ``ToolExecutor``). ``final_answer()`` on it
  returns the diff from the pristine workspace to the sandbox's, computed on the host; the sandbox
  is closed when the trajectory ends.
* ``grade(task, trajectories, answers)``: the sandbox package's isolated grader applies each diff to
  a fresh pristine copy that alone holds the hidden tests, runs the grading command, and runs the
  exploit detectors; any detected attempt sets the reward to 0 and keeps the evidence.

Needs relayrl-sandbox (``pip install 'relayrl-rollout[sandbox]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from relayrl.core.config import Section
from relayrl.core.wire import TaskSpec, Trajectory

__all__ = ["CodeEnvironment", "CodeEnvironmentConfig", "SandboxEnvironment"]


class SandboxEnvironment:
    """Per-trajectory tool sandboxes and the isolated grader of one sandbox backend."""

    def __init__(self, backend: Any = None, *, section: Any = None, pm: Any = None) -> None:
        from relayrl.sandbox import Grader, SandboxSection, open_backend

        self.section = section or SandboxSection()
        self.backend = backend or open_backend(section=self.section, pm=pm)
        self.grader = Grader(self.backend, section=self.section, pm=pm)

    @contextlib.asynccontextmanager
    async def tools(self, task: TaskSpec) -> AsyncIterator[Any]:
        from relayrl.sandbox import ToolBox, prepare_workspace, workspace_diff
        from relayrl.sandbox.workspace import task_private_paths

        with tempfile.TemporaryDirectory(prefix="relayrl-task-") as temp:
            pristine = Path(temp) / "workspace"
            await asyncio.to_thread(prepare_workspace, task, pristine, reference_globs=self.section.reference_globs)
            # The task's whole source (gold patch, originals, hidden tests) is masked, as in the grader.
            sandbox = await asyncio.to_thread(self.backend.create, pristine, hide=task_private_paths(task))
            try:
                toolbox = ToolBox.from_section(sandbox, self.section)
                toolbox.final_answer = lambda: workspace_diff(pristine, sandbox.workdir)  # type: ignore[attr-defined]
                yield toolbox
            finally:
                await asyncio.to_thread(sandbox.close)

    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        return await asyncio.to_thread(self.grader.grade_trajectories, task, list(zip(trajectories, answers)))


class CodeEnvironmentConfig(Section, kw_only=True):
    """Options of the ``code`` environment (``[rollout.environment_options]``)."""

    tasks: str = ""
    """A task source for ``relayrl.sandbox.load_tasks`` (directory or JSONL); empty: the shipped bug-fix tasks."""


class CodeEnvironment(SandboxEnvironment):
    """Environment ``code``: bug-fix tasks, agent tools in sandboxes, hidden tests in an isolated grader."""

    Config = CodeEnvironmentConfig

    def __init__(self, config: CodeEnvironmentConfig | None = None, *, sandbox: Any = None, pm: Any = None) -> None:
        super().__init__(section=sandbox, pm=pm)
        self.config = config or CodeEnvironmentConfig()

    def tasks(self) -> list[TaskSpec]:
        from relayrl.sandbox import load_tasks, shipped_tasks

        return list(load_tasks(self.config.tasks)) if self.config.tasks else list(shipped_tasks())

    def metrics(self) -> dict[str, float]:
        return {}
