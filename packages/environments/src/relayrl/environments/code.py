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

:class:`CodeEnvironment` (``code``) adds the bug-fix tasks, a character alphabet and markup for a
fresh model's tokenizer, and demonstrations for a supervised warm-up: an expert that applies each
task's gold patch with the tools (:mod:`relayrl.environments.bugfix`).

"""

from __future__ import annotations

import asyncio
import contextlib
import string
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from relayrl.core.config import Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec, Trajectory
from relayrl.rollout.environment import Environment

__all__ = ["ALPHABET", "SPECIALS", "CodeEnvironment", "CodeEnvironmentConfig", "SandboxEnvironment"]

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\t"
"""Every character of source code, tool calls and results a fresh model's character tokenizer covers."""

SPECIALS = ("<tool_call>", "</tool_call>", '{"name": "', '", "arguments": {', '"path": "', '", "old": "',
            '", "new": "', '", "content": "', '"command": "', '"pattern": "', '"code": "', '"}}', "read_file",
            "write_file", "edit", "bash", "grep", "list", "python", " exit=0", " error: ", "replaced 1 occurrence(s) in ",
            "\\n", "    ", "def ", "return ", "self.")
"""Markup and frequent code the character tokenizer keeps whole (a small BPE vocabulary would): the
tool-call JSON, the tool names, an escaped newline and an indent. The model still writes every
character of a call's arguments."""


class SandboxEnvironment(Environment):
    """Per-trajectory tool sandboxes and the isolated grader of one sandbox backend."""

    def __init__(self, backend: Any = None, *, section: Any = None, pm: PluginManager | None = None) -> None:
        from relayrl.sandbox import Grader, SandboxSection, open_backend

        self.section = section or SandboxSection()
        self.backend = backend or open_backend(section=self.section, pm=pm)
        self.grader = Grader(self.backend, section=self.section, pm=pm)

    @contextlib.asynccontextmanager
    async def tools(self, task: TaskSpec) -> AsyncIterator[Any]:
        from relayrl.environments.bugfix import SHIPPED_TASKS
        from relayrl.sandbox import ToolBox, prepare_workspace, workspace_diff
        from relayrl.sandbox.workspace import task_private_paths

        with tempfile.TemporaryDirectory(prefix="relayrl-task-") as temp:
            pristine = Path(temp) / "workspace"
            await asyncio.to_thread(prepare_workspace, task, pristine, reference_globs=self.section.reference_globs)
            # The task's whole source (gold patch, originals, hidden tests) is masked, as in the grader,
            # and so are the tasks this package ships (world-readable in site-packages), whatever the task.
            hide = [*task_private_paths(task), str(SHIPPED_TASKS)]
            sandbox = await asyncio.to_thread(self.backend.create, pristine, hide=hide)
            try:
                # The answer is the diff from the pristine workspace to the sandbox's, computed on the host.
                yield ToolBox.from_section(sandbox, self.section, answer=lambda: workspace_diff(pristine, sandbox.workdir))
            finally:
                await asyncio.to_thread(sandbox.close)

    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        return await asyncio.to_thread(self.grader.grade_trajectories, task, list(zip(trajectories, answers)))


class CodeEnvironmentConfig(Section, kw_only=True):
    """Options of the ``code`` environment (``[rollout.environment_options]``)."""

    tasks: str = ""
    """A task source for ``relayrl.sandbox.load_tasks`` (directory or JSONL); empty: the shipped bug-fix tasks."""
    eval_tasks: str = ""
    """A task source of held-out tasks (``relayrl eval``, ``[eval]``); empty: none. A training task
    with the same id or instruction as one of them is never trained on."""
    demonstration_tasks: str = ""
    """Where the warm-up's expert gets its tasks (it applies their gold patches with the tools); empty:
    the training tasks themselves, which hands the policy their answers before RL: right for a smoke
    test of the path, wrong for measuring learning."""


class CodeEnvironment(SandboxEnvironment):
    """Environment ``code``: bug-fix tasks, agent tools in sandboxes, hidden tests in an isolated grader."""

    Config = CodeEnvironmentConfig
    alphabet = ALPHABET
    specials = SPECIALS

    def __init__(self, config: CodeEnvironmentConfig | None = None, *, sandbox: Any = None, pm: PluginManager | None = None) -> None:
        super().__init__(section=sandbox, pm=pm)
        self.config = config or CodeEnvironmentConfig()

    def tasks(self) -> list[TaskSpec]:
        from relayrl.environments.bugfix import shipped_tasks
        from relayrl.sandbox import load_tasks

        return list(load_tasks(self.config.tasks)) if self.config.tasks else shipped_tasks()

    def eval_tasks(self) -> list[TaskSpec]:
        from relayrl.sandbox import load_tasks

        return list(load_tasks(self.config.eval_tasks)) if self.config.eval_tasks else []

    def demonstration_tasks(self) -> list[TaskSpec]:
        """The expert's tasks: ``demonstration_tasks``, else the training tasks (held-out ones excluded)."""
        from relayrl.rollout.evaluation import split_tasks
        from relayrl.sandbox import load_tasks

        if self.config.demonstration_tasks:
            return list(load_tasks(self.config.demonstration_tasks))
        return split_tasks(self)[0]

    async def demonstrate(self, *, harness: Any, chat: Any, tokenizer: Any) -> list[Trajectory]:
        """The gold-patch expert (:func:`relayrl.environments.bugfix.fix_reply`) on every demonstration task
        with a patch it can apply, through ``harness`` and the real tools; the others are skipped
        and named in one line on stderr."""
        from relayrl.environments.bugfix import fix_reply
        from relayrl.rollout.demonstrations import play_scripted

        tasks = self.demonstration_tasks()
        edits, skipped = await asyncio.to_thread(self._expert_edits, tasks)
        if skipped:
            print(f"code environment: no demonstration for {len(skipped)} task(s): {'; '.join(skipped)}",
                  file=sys.stderr)
        if not edits:
            raise ValueError("code environment: no demonstration task has a gold patch the expert can apply "
                             "(rollout.environment_options.demonstration_tasks)")
        compaction_prompt, summary_header = harness.compaction_markers()

        def reply(task_id: str, context: str) -> str:
            return fix_reply(edits[task_id], context, compaction_prompt=compaction_prompt,
                             summary_header=summary_header)

        tasks = [task for task in tasks if task.task_id in edits]
        return await play_scripted(tasks, reply, tools=self.tools, harness=harness, chat=chat, tokenizer=tokenizer)

    def _expert_edits(self, tasks: list[TaskSpec]) -> tuple[dict[str, list[Any]], list[str]]:
        """Each task's expert edits, read from its prepared workspace; and why the others have none."""
        from relayrl.environments.bugfix import UnsupportedPatch, patch_edits
        from relayrl.sandbox import prepare_workspace

        edits: dict[str, list[Any]] = {}
        skipped: list[str] = []
        for task in tasks:
            if not task.gold_patch:
                skipped.append(f"{task.task_id} (no gold patch)")
                continue
            with tempfile.TemporaryDirectory(prefix="relayrl-demo-") as temp:
                workspace = Path(temp) / "workspace"
                prepare_workspace(task, workspace, reference_globs=self.section.reference_globs)
                try:
                    edits[task.task_id] = patch_edits(task.gold_patch, lambda path: _read_inside(workspace, path))  # noqa: B023
                except (UnsupportedPatch, OSError, UnicodeDecodeError) as exc:
                    skipped.append(f"{task.task_id} ({exc})")
        return edits, skipped

    def metrics(self) -> dict[str, float]:
        return {}


def _read_inside(workspace: Path, path: str) -> str:
    """The text of ``path`` in ``workspace``; a patch path that leads out of it is not followed."""
    from relayrl.environments.bugfix import UnsupportedPatch

    target = (workspace / path).resolve()
    if not target.is_relative_to(workspace.resolve()):
        raise UnsupportedPatch(f"{path}: outside the workspace")
    return target.read_text()
