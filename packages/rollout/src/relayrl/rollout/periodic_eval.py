"""Held-out evaluation during a run (``[eval]``), on the rollout side.

:class:`PeriodicEval` runs next to the rollout manager in the rollout process. It watches the
trainer's progress on the bus; once before the first step and then every ``every_steps`` steps it
evaluates the held-out tasks with :func:`relayrl.rollout.evaluation.evaluate` through the same
proxy, router and engines as the training groups: a separate stream of requests whose share of
the fleet is ``max_concurrent_groups`` tasks in flight. Training never waits for it: the engines
batch its requests with the training ones, and the manager keeps starting groups.

Engines keep applying new weights while an evaluation runs (pausing them would stall training),
so an evaluation can span policy versions; each result records the trainer step and version when
it started and the range of versions its tokens came from. ``relayrl eval RUN_DIR@VERSION`` gives
the number for one exact version.

Results go to ``results_dir``: ``run.jsonl`` (one line per evaluation: step, versions, time, pass@k,
mean reward, tokens, turns, tool calls, flagged samples) and ``step-NNNNNN.jsonl`` (its per-sample
records). A resumed run continues the schedule from the last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relayrl.buffer.progress import read_progress
from relayrl.core.wire import TaskSpec
from relayrl.rollout.evaluation import RecordFile, evaluate, summarize

__all__ = ["PeriodicEval", "read_results"]

RESULTS_FILE = "run.jsonl"


def read_results(results_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every evaluation recorded in ``results_dir`` (``[]`` when there is none)."""
    path = Path(results_dir) / RESULTS_FILE
    if not path.exists():
        return []
    results = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line torn by a kill
            results.append(json.loads(line))
    return results


class PeriodicEval:
    """Evaluates the fleet's policy on held-out tasks every ``section.every_steps`` trainer steps."""

    def __init__(self, section: Any, tasks: Sequence[TaskSpec], *, harness: Any, proxy: Any, chat: Any,
                 sampling: Any, grader: Any, tools: Any, store: Any, results_dir: str | os.PathLike[str],
                 poll_s: float = 0.5, on_result: Callable[[dict[str, Any]], None] | None = None) -> None:
        if not tasks:
            raise ValueError("[eval] every_steps is set, but the environment has no held-out tasks (eval_tasks())")
        self.section = section
        self.tasks = list(tasks[:section.tasks] if section.tasks else tasks)
        self.harness, self.proxy, self.chat, self.sampling = harness, proxy, chat, sampling
        self.grader, self.tools, self.store = grader, tools, store
        self.results_dir = Path(results_dir)
        self.poll_s = poll_s
        self.on_result = on_result
        """Called with each result once it is recorded (the rollout process publishes its status at once)."""
        previous = read_results(self.results_dir)
        self.last: dict[str, Any] | None = previous[-1] if previous else None
        """The newest result."""
        self.last_step: int | None = int(self.last["step"]) if self.last else None
        """The trainer step of the last evaluation tried (the schedule counts from it, even one that failed)."""
        self.evaluations = 0

    def due(self, step: int) -> bool:
        """Whether an evaluation is due at trainer step ``step``."""
        return self.last_step is None or step >= self.last_step + self.section.every_steps

    async def run(self) -> None:
        """Evaluate whenever one is due, until cancelled."""
        while True:
            progress = read_progress(self.store)
            step = progress.step
            if not self.due(step):
                await asyncio.sleep(self.poll_s)
                continue
            self.last_step = step
            try:
                await self.evaluate_now(step, progress.version)
            except Exception as exc:  # an evaluation must never take the rollout process down with it
                print(f"eval at step {step} failed ({type(exc).__name__}: {exc}); next try in "
                      f"{self.section.every_steps} steps", file=sys.stderr, flush=True)

    async def evaluate_now(self, step: int, version: int) -> dict[str, Any]:
        """One evaluation, labelled with the trainer's ``step`` and ``version`` at its start; its result."""
        started, wall_start = time.monotonic(), time.time()
        section = self.section
        records = await evaluate(self.tasks, samples=section.samples, harness=self.harness, proxy=self.proxy,
                                 chat=self.chat, sampling=self.sampling, grader=self.grader, tools=self.tools,
                                 seed=section.seed, pass_threshold=section.pass_threshold,
                                 concurrency=section.max_concurrent_groups)
        versions = [version for record in records for version in record.versions]
        overall = summarize(records, section.ks)["overall"]
        result = {"step": step, "version": version, "versions": [min(versions, default=0), max(versions, default=0)],
                  "time": wall_start, "wall_s": round(time.monotonic() - started, 3),
                  **{key: overall[key] for key in ("tasks", "samples", "mean_reward", "tokens", "turns", "tool_calls",
                                                   "tool_seconds", "flagged_samples", "tokens_per_solved")},
                  **{f"pass@{k}": overall[f"pass@{k}"] for k in section.ks}}
        self.results_dir.mkdir(parents=True, exist_ok=True)
        RecordFile(self.results_dir / f"step-{step:06d}.jsonl").append(records)
        with open(self.results_dir / RESULTS_FILE, "a") as handle:
            handle.write(json.dumps(result) + "\n")
        self.last, self.last_step = result, step
        self.evaluations += 1
        if self.on_result is not None:
            self.on_result(result)
        print(f"eval at step {step} (versions {result['versions'][0]}-{result['versions'][1]}): "
              + ", ".join(f"pass@{k} {result[f'pass@{k}']:.3f}" for k in section.ks)
              + f", {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
        return result

    def metrics(self) -> dict[str, float]:
        """The newest evaluation as ``eval/...`` metrics (what the trainer folds into its steps)."""
        if self.last is None:
            return {}
        names = ["step", "mean_reward", "tokens", "turns", "tool_calls", "flagged_samples",
                 *(f"pass@{k}" for k in self.section.ks)]
        metrics = {f"eval/{name}": float(self.last[name]) for name in names if self.last.get(name) is not None}
        metrics["eval/version_min"], metrics["eval/version_max"] = map(float, self.last["versions"])
        return metrics
