"""Grade many short answers with one sandboxed command: the environments whose answer is text.

Model output is untrusted, so an answer is never parsed or scored on the host: a small stdlib-only
script runs in a sandbox (no network, read-only host), reads ``[item, ...]`` as JSON on stdin and
prints one reward per item as a JSON list. Starting a sandboxed process costs milliseconds and
scoring an answer microseconds, so answers of groups that finish within ``window_s`` of each other
are graded by one command.

    grader = BatchedSandboxGrader(GRADE_SCRIPT, name="countdown", sandbox=section, pm=pm)
    rewards = await grader.grade([{"answer": "7*3-4", ...}, ...])
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from relayrl.core.plugins import PluginManager

__all__ = ["BatchedSandboxGrader"]


class BatchedSandboxGrader:
    """Rewards from ``script`` run in a fresh sandbox, one command per window of answers."""

    def __init__(self, script: str, *, name: str, sandbox: Any = None, pm: PluginManager | None = None, window_s: float = 0.02,
                 timeout_s: float = 30.0) -> None:
        self.script = script
        self.name = name
        self.window_s = window_s
        self.timeout_s = timeout_s
        self._sandbox_section = sandbox
        self._pm = pm
        self._backend: Any = None
        self._waiting: list[tuple[list[dict[str, Any]], asyncio.Future[list[float]]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self.sandbox_calls = 0
        self.graded_answers = 0

    def backend(self) -> Any:
        """The sandbox backend of the run's ``[sandbox]`` section, opened on first use."""
        if self._backend is None:
            from relayrl.sandbox import SandboxSection, open_backend

            self._backend = open_backend(section=self._sandbox_section or SandboxSection(), pm=self._pm)
        return self._backend

    def grade_sync(self, items: list[dict[str, Any]]) -> list[float]:
        """Grade ``items`` with one command in a fresh sandbox (blocking)."""
        with self.backend().create() as sandbox:
            result = sandbox.exec(["python3", "-I", "-c", self.script], stdin=json.dumps(items), timeout=self.timeout_s)
        self.sandbox_calls += 1
        self.graded_answers += len(items)
        if not result.ok:
            raise RuntimeError(f"{self.name} grader failed (exit {result.exit_status}): {result.output[-2000:]}")
        rewards = json.loads(result.stdout)
        if len(rewards) != len(items):
            raise RuntimeError(f"{self.name} grader returned {len(rewards)} rewards for {len(items)} answers")
        return [float(reward) for reward in rewards]

    async def grade(self, items: list[dict[str, Any]]) -> list[float]:
        """Rewards of ``items``, graded together with whatever else arrives within the window."""
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._waiting.append((items, future))
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.window_s, self._grade_waiting)
        return await future

    def _grade_waiting(self) -> None:
        self._flush = None
        waiting, self._waiting = self._waiting, []
        items = [item for batch, _ in waiting for item in batch]

        def resolve(job: asyncio.Future[list[float]]) -> None:
            error = job.exception()
            position = 0
            for batch, future in waiting:
                start, position = position, position + len(batch)
                if future.done():  # its group was cancelled meanwhile
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(job.result()[start:position])

        job = asyncio.ensure_future(asyncio.to_thread(self.grade_sync, items))
        job.add_done_callback(resolve)

    def metrics(self) -> dict[str, float]:
        return {"sandbox/calls": float(self.sandbox_calls), "sandbox/graded_answers": float(self.graded_answers)}

    def close(self) -> None:
        self._backend = None
