"""Prompt scheduling on the rollout side: which task to roll out next.

:class:`PromptScheduler` walks the task list in epochs, each a fresh permutation drawn from the
run seed and the epoch number, so the order is reproducible and needs no random-generator state
in checkpoints. From every scored group it updates the task's pass-rate estimate (decayed counts,
so the estimate follows the improving policy). With ``difficulty_filter`` on it keeps the tasks
the current policy solves a low but non-zero fraction of the time (``band``): a task always solved
or never solved gives every sample the same reward, hence zero advantage and no learning signal.
An excluded task still comes up at ``retest_rate`` when its turn comes, so a task that the policy
has learned to solve sometimes (or forgotten) can come back; the draw is a hash of (seed, task,
epoch), again stateless.

Example::

    scheduler = PromptScheduler(tasks, config.buffer.prompts, seed=config.run.seed)
    pick = scheduler.next()                 # Pick(task=..., reason="eligible")
    ...
    scheduler.observe(group)                # after grading the group
    checkpoint["prompts"] = scheduler.state()
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from relayrl.buffer.config import PromptsSection
from relayrl.buffer.hookspecs import PROMPT_SCHEDULERS
from relayrl.core import wire
from relayrl.core.errors import WireError
from relayrl.core.plugins import PluginManager

if TYPE_CHECKING:
    pass



class TaskStats(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Decayed pass and attempt counts of one task."""

    passes: float = 0.0
    attempts: float = 0.0
    samples: int = 0
    """Undecayed number of samples seen (decides whether the estimate is trusted yet)."""


class PromptSchedulerState(msgspec.Struct, frozen=True, kw_only=True):
    """Checkpointable state of a :class:`PromptScheduler`."""

    epoch: int = 0
    position: int = 0
    """Index into the epoch's permutation of the next task to consider."""
    stats: dict[str, TaskStats] = {}
    picks: dict[str, int] = {}
    """Reason -> tasks scheduled for that reason so far."""
    skipped: int = 0
    """Turns of excluded tasks that were passed over."""


@dataclasses.dataclass(frozen=True)
class Pick:
    """A scheduled task and why: ``eligible``, ``unknown`` (too few samples), ``retest``, ``forced``."""

    task: Any
    task_id: str
    reason: str


def _task_id(task: Any) -> str:
    return task if isinstance(task, str) else task.task_id


class PromptScheduler:
    """Seeded, checkpointable task iteration with per-task pass rates and a difficulty band."""

    def __init__(self, tasks: Sequence[Any], config: PromptsSection | None = None, *, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("prompt scheduler: the task source is empty")
        self.tasks = list(tasks)
        self.config = config or PromptsSection()
        low, high = self.config.band
        if low > high:
            raise ValueError(f"buffer.prompts.band: lower bound {low} is above upper bound {high}")
        self.seed = seed
        self._ids = [_task_id(task) for task in self.tasks]
        if len(set(self._ids)) != len(self._ids):
            duplicates = sorted({task_id for task_id in self._ids if self._ids.count(task_id) > 1})
            raise ValueError(f"prompt scheduler: duplicate task ids {duplicates[:5]}")
        # Counters live in ``_state``; the per-task stats in a plain dict, since observe() runs per
        # group and copying a dict of a whole task pool each time would not scale.
        self._state = PromptSchedulerState()
        self._stats: dict[str, TaskStats] = {}
        self._permutation: list[int] = []
        self._permutation_epoch = -1

    # --------------------------------------------------------------------------- estimates
    def pass_rate(self, task_id: str) -> float | None:
        """Estimated pass rate of ``task_id``; None until ``min_samples`` samples were seen."""
        stats = self._stats.get(task_id)
        if stats is None or stats.samples < max(1, self.config.min_samples) or stats.attempts <= 0:
            return None
        return stats.passes / stats.attempts

    def observe(self, group: wire.Group) -> None:
        """Update the estimate of the group's task from its scored trajectories."""
        passes = sum(1 for trajectory in group.trajectories if trajectory.reward >= self.config.success_threshold)
        self.observe_counts(group.task_id, passes, len(group.trajectories))

    def observe_counts(self, task_id: str, passes: int, attempts: int) -> None:
        """Update the estimate of ``task_id`` with ``passes`` out of ``attempts``."""
        if not 0 <= passes <= attempts:
            raise ValueError(f"task {task_id!r}: {passes} passes out of {attempts} attempts")
        old = self._stats.get(task_id, TaskStats())
        decay = self.config.estimate_decay
        self._stats[task_id] = TaskStats(passes=old.passes * decay + passes, attempts=old.attempts * decay + attempts,
                                         samples=old.samples + attempts)

    def in_band(self, task_id: str) -> bool | None:
        """Whether the task's estimate lies in the band; None while unknown."""
        rate = self.pass_rate(task_id)
        if rate is None:
            return None
        low, high = self.config.band
        return low <= rate <= high

    # --------------------------------------------------------------------------- iteration
    def next(self) -> Pick:
        """The next task to roll out (with the reason it was scheduled)."""
        state = self._state
        epoch, position, skipped = state.epoch, state.position, state.skipped
        pick = None
        # At most one full cycle: if every task is excluded and none drew a re-test, the next task
        # is scheduled anyway ("forced") rather than spinning forever.
        for _ in range(len(self.tasks) + 1):
            if position >= len(self.tasks):
                epoch, position = epoch + 1, 0
            index = self._order(epoch)[position]
            position += 1
            reason = self._reason(self._ids[index], epoch)
            if reason is not None:
                pick = Pick(self.tasks[index], self._ids[index], reason)
                break
            skipped += 1
        if pick is None:
            pick = Pick(self.tasks[index], self._ids[index], "forced")
        picks = dict(state.picks)
        picks[pick.reason] = picks.get(pick.reason, 0) + 1
        self._state = msgspec.structs.replace(state, epoch=epoch, position=position, skipped=skipped, picks=picks)
        return pick

    def _reason(self, task_id: str, epoch: int) -> str | None:
        if not self.config.difficulty_filter:
            return "eligible"
        in_band = self.in_band(task_id)
        if in_band is None:
            return "unknown"
        if in_band:
            return "eligible"
        return "retest" if self._retest_draw(task_id, epoch) < self.config.retest_rate else None

    def _retest_draw(self, task_id: str, epoch: int) -> float:
        digest = hashlib.blake2b(f"{self.seed}\0{epoch}\0{task_id}".encode(), digest_size=8).digest()
        return struct.unpack("<Q", digest)[0] / 2 ** 64

    def _order(self, epoch: int) -> list[int]:
        if epoch != self._permutation_epoch:
            self._permutation = list(range(len(self.tasks)))
            random.Random(f"relayrl-prompts/{self.seed}/{epoch}").shuffle(self._permutation)
            self._permutation_epoch = epoch
        return self._permutation

    # --------------------------------------------------------------------------- state
    def state(self) -> PromptSchedulerState:
        """Checkpointable state (an immutable snapshot)."""
        return msgspec.structs.replace(self._state, stats=dict(self._stats))

    def restore(self, state: PromptSchedulerState | dict[str, Any] | bytes) -> None:
        """Continue from a :meth:`state`, its ``msgspec.to_builtins`` dict, or its msgpack bytes."""
        try:
            if isinstance(state, PromptSchedulerState):
                restored = state
            elif isinstance(state, (bytes, bytearray, memoryview)):
                restored = msgspec.msgpack.decode(state, type=PromptSchedulerState)
            else:
                restored = msgspec.convert(state, PromptSchedulerState, strict=False)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise WireError(f"prompt scheduler state: invalid: {exc}") from None
        self._state = msgspec.structs.replace(restored, stats={})
        self._stats = dict(restored.stats)

    def metrics(self, prefix: str = "prompts/") -> dict[str, float]:
        """Counts by reason, skipped turns, and how many known tasks are in and out of the band."""
        out: dict[str, float] = {f"{prefix}picks/{reason}": count for reason, count in sorted(self._state.picks.items())}
        out[f"{prefix}skipped"] = self._state.skipped
        verdicts = [self.in_band(task_id) for task_id in self._stats]
        out[f"{prefix}tasks_in_band"] = sum(1 for verdict in verdicts if verdict)
        out[f"{prefix}tasks_out_of_band"] = sum(1 for verdict in verdicts if verdict is False)
        return out


def create_prompt_scheduler(tasks: Sequence[Any], config: PromptsSection | None = None, *, seed: int = 0,
                            pm: PluginManager | None = None) -> Any:
    """The scheduler ``config.scheduler`` names, built from the registry."""
    config = config or PromptsSection()
    record = PROMPT_SCHEDULERS.lookup(pm, config.scheduler)
    return record.factory(tasks, config, seed=seed)
