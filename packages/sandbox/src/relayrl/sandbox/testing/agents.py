"""Scripted agents: fixed tool-call turns run through the real tools, sandbox and grader.

Detectors and the grader are tested end to end with them: an honest agent that fixes the bug, and
cheating agents that edit tests, read history, try the network ... Each produces the same
``(Trajectory, diff)`` pair a real agent loop would hand to the grader::

    agent = ScriptedAgent([[call("edit", path="stats/median.py", old="...", new="...")]])
    trajectory, diff = agent.run(task, backend)
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relayrl.core.wire import TaskSpec, ToolCall, Trajectory, TrajectorySegment, Turn
from relayrl.sandbox.api import SandboxBackend
from relayrl.sandbox.config import DEFAULT_REFERENCE_GLOBS
from relayrl.sandbox.tools import ToolBox
from relayrl.sandbox.workspace import prepare_workspace, task_private_paths, workspace_diff

__all__ = ["ScriptedAgent", "call"]

_ids = itertools.count()


def call(name: str, **arguments: Any) -> ToolCall:
    """A tool call with a fresh id."""
    return ToolCall(id=f"call-{next(_ids)}", name=name, arguments=arguments)


class ScriptedAgent:
    """Replays ``turns`` (each a list of tool calls run concurrently) in a sandbox of the task."""

    def __init__(self, turns: Sequence[Sequence[ToolCall]], *, reference_globs: Sequence[str] = DEFAULT_REFERENCE_GLOBS) -> None:
        self.turns = [list(turn) for turn in turns]
        self.reference_globs = list(reference_globs)

    def run(self, task: TaskSpec, backend: SandboxBackend, *, sample_index: int = 0) -> tuple[Trajectory, str]:
        """Run the script; return the trajectory (tool calls and results) and the final diff."""
        with tempfile.TemporaryDirectory(prefix="relayrl-agent-") as temp:
            pristine = Path(temp) / "pristine"
            prepare_workspace(task, pristine, reference_globs=self.reference_globs)
            with backend.create(pristine, hide=task_private_paths(task)) as sandbox:
                toolbox = ToolBox(sandbox)
                turns = [Turn(role="user", text=task.instruction)]
                for calls in self.turns:
                    results = toolbox.run_turn(calls)
                    turns.append(Turn(role="assistant", tool_calls=calls, tool_results=results))
                diff = workspace_diff(pristine, sandbox.workdir)
        trajectory = Trajectory(trajectory_id=f"{task.task_id}-{sample_index}", task_id=task.task_id,
                                group_id=task.task_id, sample_index=sample_index,
                                segments=[TrajectorySegment(turns=turns)])
        return trajectory, diff
