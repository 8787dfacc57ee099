"""Countdown-lite: a verifiable arithmetic task small enough to learn on two CPU cores.

A prompt is ``"a b c>T:"``: three numbers from 1 to 9 and a target ``T`` (0 to 99) that some
``+ - *`` expression over exactly those three numbers (any order, no parentheses, usual precedence)
evaluates to. The answer is such an expression, e.g. ``"7*3-4"`` for ``"3 4 7>17:"``. Reward 1 when
the answer is well formed, uses exactly the multiset ``{a, b, c}`` and evaluates to ``T``; else 0.

Grading runs in the sandbox (relayrl-sandbox): the answers are untrusted model output, so they are
parsed and evaluated by a small script in a sandboxed process without network, never on the host.
Answers of groups that finish together are graded by one sandbox command (``grade_window_s``):
starting a sandboxed process costs milliseconds, a group's worth of parsing microseconds.

The environment also provides the warm-up demonstrations (the expression that made each target),
the character alphabet of its tokenizer, and a held-out evaluation set.
"""

from __future__ import annotations

import inspect
import itertools
import random
from collections.abc import Sequence
from typing import Any

from relayrl.core.config import Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec, Trajectory
from relayrl.rollout.environment import Environment, final_text, no_tools, with_rewards

__all__ = ["ALPHABET", "CountdownConfig", "CountdownEnvironment", "evaluate", "make_tasks", "score"]

ALPHABET = "0123456789+-*> :"
"""Every character of prompts and well-formed answers."""

OPERATORS = "+-*"


def evaluate(expression: str) -> int:
    """The value of a ``+ - *`` expression over single digits (task generation, and the sandboxed grader)."""
    total, sign, term, pending = 0, 1, 1, "*"
    for char in expression + "+":
        if char.isdigit():
            term = term * int(char) if pending == "*" else int(char)
        elif char == "*":
            pending = "*"
        else:
            total += sign * term
            sign, term, pending = (1 if char == "+" else -1), 1, "*"
    return total


# Runs inside the sandbox: reads [{"numbers": [...], "target": T, "answer": "..."}] on stdin, prints
# one reward per answer. Kept free of eval(): answers are parsed, not executed. The evaluator is
# this module's own ``evaluate`` (its source is prepended), so host and sandbox cannot disagree.
_GRADE_MAIN = r"""
import json, re, sys
WELL_FORMED = re.compile(r"^[1-9](?:[+\-*][1-9])*$")
rewards = []
for item in json.load(sys.stdin):
    answer = item["answer"].strip()
    ok = (bool(WELL_FORMED.match(answer))
          and sorted(int(c) for c in answer if c.isdigit()) == sorted(item["numbers"])
          and evaluate(answer) == item["target"])
    rewards.append(1.0 if ok else 0.0)
print(json.dumps(rewards))
"""


GRADE_SCRIPT = inspect.getsource(evaluate) + _GRADE_MAIN


def score(numbers: Sequence[int], target: int, answer: str) -> float:
    """The reward of ``answer`` (a reference implementation of the sandboxed grader; tests compare them)."""
    answer = answer.strip()
    if not answer or any(char not in "123456789" + OPERATORS for char in answer):
        return 0.0
    if answer[0] in OPERATORS or answer[-1] in OPERATORS or any(
            a in OPERATORS and b in OPERATORS for a, b in itertools.pairwise(answer)):
        return 0.0
    if any(a.isdigit() and b.isdigit() for a, b in itertools.pairwise(answer)):
        return 0.0
    digits = sorted(int(char) for char in answer if char.isdigit())
    return 1.0 if digits == sorted(numbers) and evaluate(answer) == target else 0.0


def make_tasks(count: int, *, seed: int, prefix: str = "cd") -> list[TaskSpec]:
    """``count`` random tasks; each keeps the expression that made it as its demonstration."""
    rng = random.Random(seed)
    tasks = []
    while len(tasks) < count:
        numbers = [rng.randint(1, 9) for _ in range(3)]
        order = rng.sample(numbers, 3)
        expression = f"{order[0]}{rng.choice(OPERATORS)}{order[1]}{rng.choice(OPERATORS)}{order[2]}"
        target = evaluate(expression)
        if not 0 <= target <= 99:
            continue
        shown = sorted(numbers)
        prompt = f"{shown[0]} {shown[1]} {shown[2]}>{target}:"
        tasks.append(TaskSpec(task_id=f"{prefix}-{len(tasks)}", instruction=prompt, kind="answer",
                              answer=expression, metadata={"numbers": shown, "target": target}))
    return tasks


class CountdownConfig(Section, kw_only=True):
    """Options of the ``countdown`` environment (``[rollout.environment_options]``)."""

    tasks: int = 20000
    """Size of the training pool (the prompt scheduler cycles through it)."""
    task_file: str = ""
    """A task set (JSONL of TaskSpecs, e.g. written by ``relayrl data filter``) to train on instead of
    the ``tasks`` generated ones; the held-out tasks stay generated."""
    eval_tasks: int = 200
    """Held-out tasks (different seed) for evaluation."""
    seed: int = 0
    grade_window_s: float = 0.02
    """Answers arriving within this window are graded by one sandbox command."""


class CountdownEnvironment(Environment):
    """Tasks, demonstrations, and sandboxed grading of countdown-lite (environment ``countdown``)."""

    Config = CountdownConfig
    alphabet = ALPHABET

    def __init__(self, config: CountdownConfig | None = None, *, sandbox: Any = None, pm: PluginManager | None = None) -> None:
        from relayrl.environments.batch_grading import BatchedSandboxGrader

        self.config = config or CountdownConfig()
        self.grader = BatchedSandboxGrader(GRADE_SCRIPT, name="countdown", sandbox=sandbox, pm=pm,
                                           window_s=self.config.grade_window_s)

    def tasks(self) -> list[TaskSpec]:
        if self.config.task_file:
            from relayrl.sandbox import load_tasks

            return list(load_tasks(self.config.task_file))
        return make_tasks(self.config.tasks, seed=self.config.seed)

    def eval_tasks(self) -> list[TaskSpec]:
        return make_tasks(self.config.eval_tasks, seed=self.config.seed + 1_000_003, prefix="cd-eval")

    @staticmethod
    def demonstration(task: TaskSpec) -> str:
        """The reference answer used by the supervised warm-up."""
        return str(task.answer)

    def tools(self, task: TaskSpec) -> Any:
        return no_tools(task)

    # ------------------------------------------------------------------ grading
    def grade_sync(self, items: list[dict[str, Any]]) -> list[float]:
        """Grade ``[{numbers, target, answer}]`` with one command in a fresh sandbox."""
        return self.grader.grade_sync(items)

    @property
    def sandbox_calls(self) -> int:
        return self.grader.sandbox_calls

    @property
    def graded_answers(self) -> int:
        return self.grader.graded_answers

    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        texts = [answer or final_text(trajectory) for trajectory, answer in zip(trajectories, answers)]
        items = [{"numbers": task.metadata["numbers"], "target": task.metadata["target"], "answer": text[:64]}
                 for text in texts]
        rewards = await self.grader.grade(items)
        return [with_rewards(trajectory, reward, correct=reward) for trajectory, reward in zip(trajectories, rewards)]

    def metrics(self) -> dict[str, float]:
        return self.grader.metrics()

    def close(self) -> None:
        self.grader.close()

