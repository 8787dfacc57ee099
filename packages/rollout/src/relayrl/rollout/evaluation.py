"""Evaluation: rollouts that are graded and recorded, never trained on.

An eval runs the training path (the run's harness, token-recording proxy, router and engines, the
environment's tool sandboxes, its isolated grader and exploit detectors); only where the graded
samples go differs: into :class:`SampleRecord` lines instead of the rollout bus. ``samples``
trajectories of one task are graded together (the grader's unit, as a group in training), with no
reward shaper: the length penalty is a training signal, not a measure of quality.

**Pass.** A sample passes when its graded reward reaches ``pass_threshold`` (default 1.0: full
marks) and no detector flagged it; a flagged sample counts as failed whatever its reward, and the
detectors that flagged it are recorded.

**Determinism.** Sample ``i`` of task ``t`` is generated with the per-request seed
:func:`sample_seed` ``(seed, t, i)`` on every request of its trajectory (engines sample a seeded
request from its own generator, whatever else is in the batch), so the same model, tasks and
seed give the same tokens and rewards, in any order and at any concurrency.

**Resumability.** The records of a task are appended to the records file (:class:`RecordFile`) in
one write once the task is graded; a restarted eval skips every task found there, so nothing is
graded twice, and a write torn by a kill is cut off and that task run again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from relayrl.algo.evaluation import pass_at_k
from relayrl.core.wire import Group, TaskSpec, Trajectory
from relayrl.rollout.costs import trajectory_costs
from relayrl.rollout.environment import Environment, final_text, no_tools
from relayrl.rollout.hookspecs import Harness
from relayrl.rollout.manager import ToolsFactory
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

__all__ = ["RecordFile", "SampleRecord", "completed_tasks", "evaluate", "sample_seed", "split_tasks", "summarize"]


class SampleRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One graded sample of an eval (a line of the records file)."""

    task_id: str
    sample: int
    seed: int
    reward: float
    """The grader's reward (no shaping)."""
    passed: bool
    flags: list[str] = []
    """Detectors that flagged the sample as a cheating attempt (it then counts as failed)."""
    status: str = "ok"
    """The harness's ending: ``ok``, ``budget_exhausted``, ``context_exhausted``, ``error``."""
    generated_tokens: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_seconds: float = 0.0
    generation_seconds: float = 0.0
    wall_seconds: float = 0.0
    versions: list[int] = []
    """Oldest and newest policy version of its tokens (``[]`` when it generated none)."""
    final_text: str = ""
    """Its last assistant message, cut to :data:`FINAL_TEXT_CHARS` characters (what it answered)."""
    trajectory_id: str = ""


FINAL_TEXT_CHARS = 300


def split_tasks(environment: Any) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """The environment's training and held-out tasks, with the held-out ones kept out of training.

    A training task that shares its id or its instruction with a held-out task is removed from the
    training tasks (generated tasks can repeat a prompt: countdown's small space of numbers and
    targets holds the same prompts under both seeds). The run's prompt scheduler and its warm-up
    draw from the first list only, so whatever is evaluated as held out never was trained on.
    """
    held_out = list(environment.eval_tasks())
    ids = {task.task_id for task in held_out}
    prompts = {task.instruction for task in held_out}
    training = [task for task in environment.tasks() if task.task_id not in ids and task.instruction not in prompts]
    return training, held_out


def sample_seed(seed: int, task_id: str, sample: int) -> int:
    """The engine seed of sample ``sample`` of ``task_id`` in an eval seeded ``seed`` (63 bits)."""
    digest = hashlib.blake2b(f"{seed}\0{task_id}\0{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _record(trajectory: Trajectory, *, sample: int, seed: int, pass_threshold: float) -> SampleRecord:
    costs = trajectory_costs(trajectory)
    flags = sorted({flag.detector for flag in trajectory.cheating})
    timings = trajectory.timings
    versions = [version for segment in trajectory.segments for turn in segment.turns if turn.generated is not None
                for version in turn.generated.token_versions()]
    return SampleRecord(
        task_id=trajectory.task_id, sample=sample, seed=seed, reward=float(trajectory.reward),
        passed=not flags and float(trajectory.reward) >= pass_threshold, flags=flags, status=trajectory.status,
        generated_tokens=costs.generated_tokens, turns=costs.turns, tool_calls=costs.tool_calls,
        tool_seconds=round(costs.tool_seconds, 4), generation_seconds=round(timings.generation_s, 4),
        wall_seconds=round(max(0.0, timings.finished_at - timings.started_at), 4),
        versions=[min(versions), max(versions)] if versions else [], final_text=final_text(trajectory)[:FINAL_TEXT_CHARS],
        trajectory_id=trajectory.trajectory_id)


class RecordFile:
    """The records of an eval: JSON lines, appended a task at a time, read back to resume."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> list[SampleRecord]:
        """Every complete record; a torn last line (a kill mid-write) is cut off the file."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete = data[:data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(len(complete))
        decoder = msgspec.json.Decoder(SampleRecord)
        return [decoder.decode(line) for line in complete.splitlines() if line.strip()]

    def append(self, records: Sequence[SampleRecord]) -> None:
        """Append ``records`` in one write and flush them to disk (a task is recorded whole or not at all:
        :meth:`read` drops a torn tail, and a task with fewer records than samples is run again)."""
        payload = b"".join(msgspec.json.encode(record) + b"\n" for record in records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())


def completed_tasks(records: Iterable[SampleRecord], samples: int) -> set[str]:
    """Tasks with all ``samples`` records: a resumed eval skips them."""
    seen: dict[str, set[int]] = {}
    for record in records:
        seen.setdefault(record.task_id, set()).add(record.sample)
    return {task_id for task_id, indices in seen.items() if indices >= set(range(samples))}


async def evaluate(tasks: Sequence[TaskSpec], *, samples: int, harness: Harness, proxy: TokenRecordingProxy,
                   chat: Any, sampling: SamplingParams, grader: Environment, tools: ToolsFactory = no_tools,
                   seed: int = 0, pass_threshold: float = 1.0, skip: Iterable[str] = (), concurrency: int = 8,
                   on_task: Callable[[int, TaskSpec, Group, list[SampleRecord]], None] | None = None,
                   ) -> list[SampleRecord]:
    """Run, grade and record ``samples`` samples of every task not in ``skip``; return the new records.

    Up to ``concurrency`` tasks run at once (their samples concurrently). ``on_task(index, task,
    group, records)`` is called, in the event loop's thread, once each task is graded: the place
    to persist it (:meth:`RecordFile.append`). Records come back in task order.
    """
    if samples < 1:
        raise ValueError(f"an eval needs at least 1 sample per task, got {samples}")
    skipped = set(skip)
    slots = asyncio.Semaphore(max(1, concurrency))
    results: dict[int, list[SampleRecord]] = {}

    async def one_task(index: int, task: TaskSpec) -> None:
        async with slots:
            group_id = f"eval{index}"  # no '/': request ids are split on it

            async def one_sample(sample: int) -> tuple[Trajectory, str]:
                params = msgspec.structs.replace(sampling, seed=sample_seed(seed, task.task_id, sample))
                async with tools(task) as toolbox:
                    trajectory = await harness.run(task, proxy=proxy, tools=toolbox, chat=chat, sampling=params,
                                                   group_id=group_id, sample_index=sample)
                    answer = await asyncio.to_thread(toolbox.final_answer) if toolbox is not None else ""
                return trajectory, answer

            played = await asyncio.gather(*(one_sample(sample) for sample in range(samples)))
            graded = await grader.grade(task, [trajectory for trajectory, _ in played], [answer for _, answer in played])
            records = [_record(trajectory, sample=sample, seed=sample_seed(seed, task.task_id, sample),
                               pass_threshold=pass_threshold) for sample, trajectory in enumerate(graded)]
            if on_task is not None:
                group = Group(group_id=group_id, task_id=task.task_id, trajectories=list(graded))
                on_task(index, task, group, records)
            results[index] = records

    await asyncio.gather(*(one_task(index, task) for index, task in enumerate(tasks)
                           if task.task_id not in skipped))
    return [record for index in sorted(results) for record in results[index]]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(records: Sequence[SampleRecord], ks: Sequence[int], *, engine_seconds: float | None = None,
              price_per_million_tokens: float | None = None, price_per_gpu_hour: float | None = None,
              categories: Mapping[str, str] | None = None) -> dict[str, Any]:
    """pass@k and costs per task and overall.

    Per task: samples, passed, pass@k for each k (the unbiased estimator), mean reward, flagged
    samples, and the mean tokens, turns, tool calls, tool seconds and wall seconds of a sample.
    Overall: the mean of each over tasks, and the cost of one solution: generated tokens per
    passing sample (what it costs on average to sample a solution), the fleet's engine-seconds per
    passing sample (``engine_seconds``: engines times the eval's generation wall time), and the
    same in money when a price is given. ``None`` where nothing passed. With ``categories`` (task id
    -> category, e.g. the dataset of each task of a mix), ``by_category`` holds tasks, samples,
    pass@k and mean reward per category, averaged over that category's tasks.
    """
    by_task: dict[str, list[SampleRecord]] = {}
    for record in records:
        by_task.setdefault(record.task_id, []).append(record)
    tasks = []
    for task_id, items in by_task.items():
        n, c = len(items), sum(record.passed for record in items)
        tasks.append({
            "task_id": task_id, "samples": n, "passed": c,
            **{f"pass@{k}": pass_at_k(n, c, k) for k in ks},
            "mean_reward": _mean([record.reward for record in items]),
            "flagged": sum(bool(record.flags) for record in items),
            "tokens": _mean([record.generated_tokens for record in items]),
            "turns": _mean([record.turns for record in items]),
            "tool_calls": _mean([record.tool_calls for record in items]),
            "tool_seconds": _mean([record.tool_seconds for record in items]),
            "wall_seconds": _mean([record.wall_seconds for record in items])})
    passed = sum(record.passed for record in records)
    tokens = sum(record.generated_tokens for record in records)
    overall: dict[str, Any] = {
        "tasks": len(tasks), "samples": len(records), "passed_samples": passed,
        **{f"pass@{k}": _mean([task[f"pass@{k}"] for task in tasks]) for k in ks},
        **{key: _mean([task[key] for task in tasks])
           for key in ("mean_reward", "tokens", "turns", "tool_calls", "tool_seconds", "wall_seconds")},
        "flagged_samples": sum(bool(record.flags) for record in records),
        "tokens_per_solved": tokens / passed if passed else None,
        "engine_seconds": engine_seconds,
        "engine_seconds_per_solved": engine_seconds / passed if passed and engine_seconds is not None else None}
    if price_per_million_tokens is not None:
        overall["price_per_solved_tokens"] = (overall["tokens_per_solved"] * price_per_million_tokens / 1e6
                                              if passed else None)
    if price_per_gpu_hour is not None:
        per_solved = overall["engine_seconds_per_solved"]
        overall["price_per_solved_engine_time"] = per_solved * price_per_gpu_hour / 3600 if per_solved is not None else None
    flagged = [{"task_id": record.task_id, "sample": record.sample, "flags": record.flags}
               for record in records if record.flags]
    summary: dict[str, Any] = {"overall": overall, "tasks": tasks, "flagged": flagged}
    if categories:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for task in tasks:
            grouped.setdefault(categories.get(task["task_id"], "?"), []).append(task)
        summary["by_category"] = {
            category: {"tasks": len(items), "samples": sum(item["samples"] for item in items),
                       **{f"pass@{k}": _mean([item[f"pass@{k}"] for item in items]) for k in ks},
                       "mean_reward": _mean([item["mean_reward"] for item in items])}
            for category, items in sorted(grouped.items())}
    return summary
