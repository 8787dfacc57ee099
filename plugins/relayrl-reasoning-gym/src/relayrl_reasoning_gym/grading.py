"""Scoring answers in the sandbox: one command per window of answers, each answer in a child of its own.

:class:`ScorerGrader` is relayrl-environments' :class:`~relayrl.environments.batch_grading.BatchedSandboxGrader`
(answers of groups that finish within ``window_s`` of each other share one sandbox command: the
scorer imports reasoning_gym once, about a second) whose command is
:mod:`relayrl_reasoning_gym.scorer` and whose result per answer is a :class:`ScoreResult`, not a
bare reward.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.errors import RelayrlError
from relayrl.core.plugins import PluginManager
from relayrl.environments.batch_grading import BatchedSandboxGrader

__all__ = ["HASH_SEED", "ScoreResult", "ScorerGrader", "generate_entries", "scorer_source"]


class ScoreResult(msgspec.Struct, frozen=True, kw_only=True):
    """The scorer's verdict on one answer."""

    reward: float
    """The dataset's ``score_answer``, clamped to [0, 1] (0 when unanswered or flagged)."""
    answered: bool
    """Whether the answer format found an answer in the final message."""
    flag: str = ""
    """``scorer-escape``, ``scorer-timeout`` or ``scorer-report-forged`` when the scoring child misbehaved."""


HASH_SEED = {"PYTHONHASHSEED": "0"}
"""Every process that makes or regenerates entries hashes strings alike (see the scorer's docstring)."""


@functools.cache
def scorer_source() -> str:
    """The scorer's text, run as ``python -s -c SOURCE`` (``-s``: no user site; not ``-I``, which
    would ignore ``PYTHONHASHSEED``; the sandbox's environment is clean anyway)."""
    return (Path(__file__).parent / "scorer.py").read_text()


def generate_entries(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of ``source`` (question, answer, category, difficulty), made by the scorer's
    ``generate`` mode in a process of the host's interpreter with the fixed hash seed."""
    result = subprocess.run([sys.executable, "-s", "-c", scorer_source(), "generate"], input=json.dumps(source),
                            capture_output=True, text=True, env={**os.environ, **HASH_SEED}, timeout=3600)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise RelayrlError(f"reasoning-gym: making the tasks of {source['name']} failed: "
                           f"{lines[-1] if lines else f'exit {result.returncode}'}")
    return list(json.loads(result.stdout))


class ScorerGrader(BatchedSandboxGrader):
    """Batched sandbox scoring of reasoning-gym answers (see the module docstring).

    ``python`` is called once, on first use, for the interpreter the sandbox runs (resolving it may
    probe the sandbox or build a grader environment).
    """

    def __init__(self, *, python: Any, answer_format: str, tag: str, timeout_s: float, sandbox: Any = None,
                 pm: PluginManager | None = None, window_s: float = 0.05) -> None:
        super().__init__("", name="reasoning-gym", sandbox=sandbox, pm=pm, window_s=window_s)
        self._resolve_python = python
        self._python: str | None = None
        self.answer_format = answer_format
        self.tag = tag
        self.answer_timeout_s = timeout_s

    def python(self) -> str:
        if self._python is None:
            self._python = self._resolve_python(self.backend())
        return self._python

    def grade_sync(self, items: list[dict[str, Any]]) -> list[ScoreResult]:  # type: ignore[override]
        """Score ``items`` (``{"source", "index", "text"}``) with one command in a fresh sandbox."""
        job = {"format": self.answer_format, "tag": self.tag, "timeout_s": self.answer_timeout_s, "items": items}
        # Every answer may take its timeout, plus the import and the regeneration of entries.
        timeout = 120.0 + self.answer_timeout_s * len(items)
        python = self.python()  # first: resolving it exposes the interpreter to the sandboxes made after
        with self.backend().create() as sandbox:
            result = sandbox.exec([python, "-s", "-c", scorer_source()], stdin=json.dumps(job), timeout=timeout,
                                  env=HASH_SEED)
        self.sandbox_calls += 1
        self.graded_answers += len(items)
        if not result.ok:
            raise RuntimeError(f"reasoning-gym scorer failed (exit {result.exit_status}): {result.output[-2000:]}")
        results = msgspec.json.decode(result.stdout.strip().splitlines()[-1], type=list[ScoreResult])
        if len(results) != len(items):
            raise RuntimeError(f"reasoning-gym scorer returned {len(results)} results for {len(items)} answers")
        return results
