"""Environment ``kernels``: write a faster implementation of a reference function, multi-turn.

Each task shows a NumPy reference (:mod:`relayrl.environments.kernels.catalog`), or with ``framework =
"torch"`` a PyTorch one (:mod:`relayrl.environments.kernels.torch_catalog`, graded on ``device``), and
asks for ``kernel`` with the same semantics, faster. The agent's one tool, ``submit`` (``{"code": SOURCE}``), grades a
candidate in a sandbox and returns what Kevin's environment returned: load (compile) errors,
correctness on fresh inputs, the measured speed-up, or why it was rejected. The episode's answer
is the last submitted candidate; the final grade runs the same harness again, with more timing
rounds and inputs the candidate never saw, and sets the reward (:class:`KernelReward`). Any exploit
flag zeroes it and is kept on the trajectory with its evidence.

Gradings are serialised within a process (a lock): concurrent timings on one core would only add
noise to both sides of every ratio. A candidate is graded once per task and number of rounds: the
environment keeps the last :data:`REPORTS_KEPT` reports, so identical submissions (a sharpened policy
writes many) and identical answers within a group share one grading. With ``final_grade = false``
the reward is the last submission's own grading (its rounds are ``feedback_rounds``), one grading
less per episode; with ``best_submission = true`` as well, the best of the episode's submissions' own
gradings (a later attempt at a faster kernel then never costs the correct one before it, the
multi-turn refinement Kevin's reward credits).

Whatever the reward is taken from, every candidate the episode submitted is checked: one flagged
as an exploit attempt zeroes the episode's reward and its evidence is kept, even when a clean
candidate came after it (its grading is the kept report of its ``submit``: no extra cost).

**Demonstrations** (the supervised warm-up) are played through the run's harness and the real
``submit`` tool on generated chains of their own stream, in one of :data:`STYLES`: submit the
fused rewrite (:func:`relayrl.environments.kernels.expert.fused_chain`), submit the reference itself
(correct, no faster), submit the reference, read its speed-up of 1, then the fused rewrite (the
multi-turn refinement the reward should come to prefer), submit a slipped rewrite
(:func:`relayrl.environments.kernels.expert.slipped`: one miscopied constant or a dropped parenthesis),
read the grader's "incorrect" or "load_error", then the right one (``retry``), or submit the slipped
rewrite and stop (``slip``: a player that ignores the feedback). Each then answers ``done``. With
both of the last two in the warm-up, what follows a failed submission is RL's to decide.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import random
import re
import string
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import CheatingFlag, TaskSpec, ToolCall, ToolResult, Trajectory
from relayrl.environments.kernels.catalog import chain_task, make_tasks
from relayrl.environments.kernels.expert import fused_chain, renamed_reference, slipped
from relayrl.environments.kernels.grading import KernelGrader, KernelReport, KernelReward
from relayrl.environments.kernels.tasks import FRAMEWORKS, kernel_task, task_spec
from relayrl.rollout.environment import Environment

__all__ = ["ALPHABET", "SPECIALS", "STYLES", "KernelConfig", "KernelEnvironment", "KernelTools", "demonstration_plan",
           "expert_reply"]

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\t"
MARKUP = ("<tool_call>", "</tool_call>", '{"name": "', '", "arguments": {', '"code": "', '"}}', "submit",
          '{"name": "submit", "arguments": {"code": "')
CODE = ("import numpy as np", "def kernel(", "def reference(", "return ", "np.", "\\n", "    ", "\\n    ",
        "np.tanh(", "np.abs(", "np.maximum(", "np.minimum(", "np.exp(", "np.negative(", "np.reciprocal(",
        "np.multiply(", "np.add(", "np.subtract(", "1.0 / (1.0 + np.exp(-", ", out=t", " ** 2", " ** 3", " = ",
        "0.0", "1.0")
FEEDBACK = (" correct; speed-up ", "x over the reference (interquartile ", " rounds)", "exit=0", "exit=1",
            "incorrect: ", "load_error: ", "Write `kernel` with the semantics of `reference` below, faster. Arguments: ",
            "float32[N]", ". Use numpy only.")
SPECIALS = (*MARKUP, *CODE, *FEEDBACK)
"""Markup and frequent code a fresh model's character tokenizer keeps whole."""

STYLES = ("fused", "copy", "copy-then-fused", "retry", "slip")
"""How a demonstration plays (see the module docstring)."""
DONE = "done"
REPORTS_KEPT = 2048
"""Reports of recent gradings kept for reuse (keyed by the task, the candidate and the rounds)."""


class KernelConfig(Section, kw_only=True):
    """Options of the ``kernels`` environment (``[rollout.environment_options]``)."""

    tasks: int = 200
    """Training tasks: the shipped ones, then generated chains of elementwise operations."""
    shipped: bool = True
    """Whether training starts with the shipped tasks; false: generated chains only (the ones the
    warm-up's expert can write a faster version of)."""
    eval_tasks: int = 40
    """Held-out tasks: generated chains from a stream of their own."""
    chain_length: tuple[int, int] = (3, 6)
    """Operations per generated chain (training, held-out and demonstration chains alike): shorter
    chains are easier to rewrite for a small model."""
    seed: int = 0
    framework: str = "numpy"
    """What tasks and candidates are written with: ``numpy``, or ``torch`` (the PyTorch catalog and
    chains; the sandbox's ``python`` must have PyTorch)."""
    device: str = "cpu"
    """Where PyTorch tasks are graded: ``cpu``, or ``cuda`` / ``cuda:N`` (needs ``framework = "torch"``
    and a sandbox backend that reaches the GPU)."""
    feedback_rounds: int = 3
    """Timing rounds of a ``submit`` (the agent's feedback): fewer than the final grade's."""
    grading_rounds: int = 10
    """Timing rounds of the final grade (the reward)."""
    final_grade: bool = True
    """Grade the episode's answer again with ``grading_rounds``; false: the reward is the last
    submission's own grading (``feedback_rounds``), one grading less per episode."""
    best_submission: bool = False
    """With ``final_grade = false``: the reward is the best of the episode's submissions' own
    gradings, not the last's."""
    timeout_s: float = 60.0
    """Wall-clock limit of one grading; a candidate that takes longer is graded ``timeout``."""
    max_submissions: int = 8
    """``submit`` calls per episode; later ones are refused (the grader's time is the budget)."""
    correct: float = 0.3
    speedup_weight: float = 1.0
    noise_floor: float = 0.1
    max_speedup: float = 10.0
    python: str = "python3"
    """The interpreter inside the sandbox (it needs NumPy: the distribution's ``python3-numpy``)."""
    demonstrations: int = 200
    """Trajectories the supervised warm-up trains on (played through the real ``submit``)."""
    demonstration_styles: dict[str, float] = msgspec.field(
        default_factory=lambda: {"fused": 0.4, "copy": 0.3, "copy-then-fused": 0.3})
    """Weights of the demonstrations' :data:`STYLES`."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        for key in ("tasks", "feedback_rounds", "grading_rounds", "max_submissions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{path}.{key}: must be at least 1, got {getattr(self, key)}")
        low, high = self.chain_length
        if not 1 <= low <= high:
            raise ConfigError(f"{path}.chain_length: [low, high] with 1 <= low <= high, got {list(self.chain_length)}")
        if self.framework not in FRAMEWORKS:
            raise ConfigError(f"{path}.framework: one of {list(FRAMEWORKS)}, got {self.framework!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"{path}.device: `cpu`, `cuda` or `cuda:N`, got {self.device!r}")
        if self.device != "cpu" and self.framework != "torch":
            raise ConfigError(f"{path}.device: NumPy candidates run on the CPU; {self.device!r} needs framework = "
                              "\"torch\"")
        if self.framework != "numpy" and self.demonstrations > 0 and \
                any(weight > 0 for style, weight in self.demonstration_styles.items() if style != "copy"):
            raise ConfigError(f"{path}.demonstration_styles: the scripted expert rewrites NumPy chains only; with "
                              f"framework = {self.framework!r} only `copy` can be demonstrated (or demonstrations = 0)")
        if self.best_submission and self.final_grade:
            raise ConfigError(f"{path}.best_submission: needs final_grade = false (the final grade regrades the "
                              "last submission only)")
        if self.eval_tasks < 0 or not self.timeout_s > 0:
            raise ConfigError(f"{path}: eval_tasks must be >= 0 and timeout_s > 0")
        styles = self.demonstration_styles
        if sorted(set(styles) - set(STYLES)) or any(weight < 0 for weight in styles.values()) \
                or sum(styles.values()) <= 0:
            raise ConfigError(f"{path}.demonstration_styles: weights >= 0 with a positive sum over {list(STYLES)}, "
                              f"got {styles}")
        if self.correct < 0 or self.speedup_weight < 0 or not 0 <= self.noise_floor < 1 or self.max_speedup < 1:
            raise ConfigError(f"{path}: reward shape needs correct >= 0, speedup_weight >= 0, "
                              f"0 <= noise_floor < 1, max_speedup >= 1")

    def reward(self) -> KernelReward:
        return KernelReward(correct=self.correct, speedup_weight=self.speedup_weight, noise_floor=self.noise_floor,
                            max_speedup=self.max_speedup)


class KernelTools:
    """One episode's tool: ``submit`` grades a candidate and answers with the grader's feedback."""

    tool_names: Sequence[str] = ("submit",)

    def __init__(self, environment: KernelEnvironment, task: TaskSpec) -> None:
        self.environment = environment
        self.task = kernel_task(task)
        self.submissions: list[str] = []

    def final_answer(self) -> str:
        return self.submissions[-1] if self.submissions else ""

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return [await self._one(call) for call in calls]  # gradings are serial anyway (one timing core)

    async def _one(self, call: ToolCall) -> ToolResult:
        code = call.arguments.get("code") if isinstance(call.arguments, dict) else None
        if call.name != "submit":
            return ToolResult(call_id=call.id, exit_status=1, error=f"unknown tool {call.name!r} (the tool is submit)")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(call_id=call.id, exit_status=1, error='submit takes {"code": "<python source>"}')
        if len(self.submissions) >= self.environment.config.max_submissions:
            return ToolResult(call_id=call.id, exit_status=1,
                              error=f"no more submissions ({self.environment.config.max_submissions} per episode)")
        self.submissions.append(code)
        self.environment.counts["submissions"] += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        report = await asyncio.to_thread(self.environment.grade_candidate, self.task, code,
                                         self.environment.config.feedback_rounds)
        return ToolResult(call_id=call.id, output=report.feedback(), exit_status=0 if report.correct else 1,
                          wall_time_s=loop.time() - started)


class KernelEnvironment(Environment):
    """Environment ``kernels`` (see the module docstring)."""

    Config = KernelConfig
    alphabet = ALPHABET
    specials = SPECIALS

    def __init__(self, config: KernelConfig | None = None, *, sandbox: Any = None, pm: PluginManager | None = None) -> None:
        self.config = config or KernelConfig()
        self.grader = KernelGrader(section=sandbox, pm=pm, python=self.config.python, device=self.config.device)
        self.reward = self.config.reward()
        self._lock = threading.Lock()
        self._reports: collections.OrderedDict[tuple[str, str, int], KernelReport] = collections.OrderedDict()
        self.counts = {"submissions": 0, "gradings": 0, "graded": 0, "correct": 0, "flagged": 0, "speedup_sum": 0.0,
                       "log_speedup_sum": 0.0, "faster": 0, "load_errors": 0, "incorrect": 0, "no_submission": 0}

    def tasks(self) -> list[TaskSpec]:
        config = self.config
        if config.shipped:
            return [task_spec(task) for task in make_tasks(config.tasks, seed=config.seed, length=config.chain_length,
                                                           framework=config.framework)]
        return [task_spec(chain_task(config.seed + index, length=config.chain_length, framework=config.framework))
                for index in range(config.tasks)]

    def demonstration_tasks(self) -> list[TaskSpec]:
        """Chains of a stream of their own (neither training nor held out), each with a drawn style."""
        base = self.config.seed + 2_000_003
        rng = random.Random(base)
        styles, weights = zip(*self.config.demonstration_styles.items())
        return [task_spec(chain_task(base + index, length=self.config.chain_length, framework=self.config.framework),
                          task_id=f"demo-chain-{base + index}", style=rng.choices(styles, weights)[0])
                for index in range(self.config.demonstrations)]

    async def demonstrate(self, *, harness: Any, chat: Any, tokenizer: Any) -> list[Trajectory]:
        """:func:`expert_reply` on :meth:`demonstration_tasks`, through ``harness`` and the real tool."""
        from relayrl.rollout.demonstrations import as_context, play_expert

        tasks = self.demonstration_tasks()
        # Two at a time: every submission is graded, and gradings are serialised anyway.
        played = await play_expert(tasks, expert_reply, tools=self.tools, harness=harness, chat=chat,
                                   tokenizer=tokenizer, concurrency=2)
        # A slipped submission is context, not a target: the warm-up teaches what follows a failed
        # submission (a retry, or stopping), never how to slip.
        demonstrations = []
        for task, trajectory in zip(tasks, played):
            slip = _slip_of(task)
            if slip is not None:
                trajectory = as_context(trajectory, lambda turn, slip=slip: any(
                    call.arguments.get("code") == slip for call in turn.tool_calls))
            demonstrations.append(trajectory)
        return demonstrations

    def eval_tasks(self) -> list[TaskSpec]:
        base = self.config.seed + 1_000_003
        return [task_spec(chain_task(base + index, length=self.config.chain_length, framework=self.config.framework),
                          task_id=f"eval-chain-{base + index}") for index in range(self.config.eval_tasks)]

    @contextlib.asynccontextmanager
    async def tools(self, task: TaskSpec) -> AsyncIterator[KernelTools]:
        yield KernelTools(self, task)

    def grade_candidate(self, task: Any, code: str, rounds: int) -> KernelReport:
        """The report of ``code`` on ``task`` with ``rounds`` timing rounds: a kept one, or a new
        grading, serialised with every other of this process (blocking)."""
        key = (msgspec.json.encode(task).decode(), code, rounds)
        with self._lock:
            if key in self._reports:
                self._reports.move_to_end(key)
                return self._reports[key]
            self.counts["gradings"] += 1
            report = self.grader.grade(task, code, rounds=rounds, timeout_s=self.config.timeout_s)
            self._reports[key] = report
            if len(self._reports) > REPORTS_KEPT:
                self._reports.popitem(last=False)
            return report

    def submissions(self, trajectory: Trajectory) -> list[str]:
        """The candidates the episode's ``submit`` calls handed in and the tool graded, in order."""
        codes = [call.arguments.get("code") for segment in trajectory.segments for turn in segment.turns
                 for call in turn.tool_calls if call.name == "submit" and isinstance(call.arguments, dict)]
        return [code for code in codes if isinstance(code, str) and code.strip()][:self.config.max_submissions]

    def _report(self, kernel: Any, trajectory: Trajectory, answer: str) -> KernelReport:
        """The report the episode's reward comes from (see the module docstring); blocking."""
        feedback = self.config.feedback_rounds
        submitted = self.submissions(trajectory)
        for code in submitted:  # an exploit attempt anywhere in the episode zeroes it
            earlier = self.grade_candidate(kernel, code, feedback)
            if earlier.flags:
                return earlier
        if self.config.final_grade:
            return self.grade_candidate(kernel, answer, self.config.grading_rounds)
        candidates = [self.grade_candidate(kernel, code, feedback)
                      for code in (submitted if self.config.best_submission else []) + [answer]]
        return max(candidates, key=self.reward)  # the first of equals: the earliest submission

    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        kernel = kernel_task(task)
        graded = []
        for trajectory, answer in zip(trajectories, answers):
            if not answer.strip():
                self.counts["no_submission"] += 1
                graded.append(_rewarded(trajectory, 0.0, KernelReport(status="no_submission")))
                continue
            report = await asyncio.to_thread(self._report, kernel, trajectory, answer)
            self.counts["graded"] += 1
            self.counts["correct"] += int(report.correct)
            self.counts["flagged"] += int(bool(report.flags))
            self.counts["load_errors"] += int(report.status == "load_error")
            self.counts["incorrect"] += int(report.status in ("incorrect", "runtime_error", "timeout", "crashed"))
            if report.correct and report.speedup and not report.flags:
                self.counts["speedup_sum"] += report.speedup
                self.counts["log_speedup_sum"] += math.log(report.speedup)
                self.counts["faster"] += int(self.reward.effective_speedup(report.speedup) > 1.0)
            graded.append(_rewarded(trajectory, self.reward(report), report))
        return graded

    def metrics(self) -> dict[str, float]:
        counts = self.counts
        return {"kernels/submissions": float(counts["submissions"]), "kernels/gradings": float(counts["gradings"]),
                "kernels/graded": float(counts["graded"]), "kernels/load_errors": float(counts["load_errors"]),
                "kernels/incorrect": float(counts["incorrect"]), "kernels/no_submission": float(counts["no_submission"]),
                "kernels/correct": float(counts["correct"]), "kernels/flagged": float(counts["flagged"]),
                "kernels/speedup_sum": float(counts["speedup_sum"]), "kernels/faster": float(counts["faster"]),
                "kernels/log_speedup_sum": float(counts["log_speedup_sum"]),
                "kernels/mean_speedup_of_correct": counts["speedup_sum"] / counts["correct"] if counts["correct"] else 0.0}


def _rewarded(trajectory: Trajectory, reward: float, report: KernelReport) -> Trajectory:
    flags = [CheatingFlag(detector=f"kernel-{flag.get('detector', '?')}", evidence=str(flag.get("evidence", ""))[:2000])
             for flag in report.flags]
    components = {"correct": float(report.correct), "speedup": float(report.speedup or 0.0),
                  "flagged": float(bool(flags))}
    return msgspec.structs.replace(trajectory, reward=0.0 if flags else reward,
                                   reward_components={**trajectory.reward_components, **components},
                                   cheating=[*trajectory.cheating, *flags],
                                   metrics={**trajectory.metrics, "kernel_status_ok": float(report.status == "ok")})


_SUBMITTED = re.compile(r'"name": "submit"')


def demonstration_plan(reference: str, style: str) -> list[str]:
    """The candidates a demonstration of ``style`` (:data:`STYLES`) submits, in order."""
    if style == "copy":  # any framework
        return [renamed_reference(reference)]
    fused = fused_chain(reference)
    return {"fused": [fused], "copy-then-fused": [renamed_reference(reference), fused],
            "retry": [slipped(fused), fused], "slip": [slipped(fused)]}[style]


def _slip_of(task: TaskSpec) -> str | None:
    """The slipped candidate a demonstration of ``task`` submits first (``retry``, ``slip``), else None."""
    if task.metadata["style"] not in ("retry", "slip"):
        return None
    return demonstration_plan(kernel_task(task).reference, task.metadata["style"])[0]


def expert_reply(task: TaskSpec, context: str, *, compaction_prompt: str, summary_header: str) -> str:
    """What a demonstration says next in ``context`` (the current segment's text, up to its turn):
    the next candidate of its style's plan, ``done`` when none is left, and when asked to compact,
    ``submitted N`` (a summary the next segment continues from)."""
    from relayrl.rollout.demonstrations import asked_to_compact

    reference = kernel_task(task).reference
    plan = demonstration_plan(reference, task.metadata["style"])
    summary = context.split(summary_header, 1)[1] if summary_header and summary_header in context else ""
    remembered = re.search(r"submitted (\d+)", summary)
    submitted = (int(remembered.group(1)) if remembered else 0) + len(_SUBMITTED.findall(context.split(summary_header)[-1]
                                                                                           if summary else context))
    if asked_to_compact(context, compaction_prompt):
        return f"submitted {submitted}"
    if submitted >= len(plan):
        return DONE
    call = json.dumps({"name": "submit", "arguments": {"code": plan[submitted]}})
    return f"<tool_call>{call}</tool_call>"
