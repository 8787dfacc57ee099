"""The trainer's loop: batch → step → publish → monitors → checkpoint → metrics → progress.

:class:`TrainingLoop` is the whole asynchronous-RL trainer of one process, with its collaborators
passed in (torchtitan's ``Trainer`` shape), so an application that embeds relayrl in its own
launcher builds the parts it wants and runs it::

    loop = TrainingLoop(backend, buffer=Buffer(bus, config.buffer), publisher=Publisher(bus),
                        checkpointer=AsyncCheckpointer(store), monitors=build_monitors(config.algo),
                        metrics=MetricsWriter(run_dir), progress=lambda p: write_progress(bus, p))
    loop.run(stop_event)

Each step:

1. take the next batch of complete groups from the buffer at the backend's policy version (the
   buffer's staleness admission compares it with every token's version); while none is ready,
   settle groups that can never be trained (too stale), so the fleet is not held back by them;
2. one optimiser step (the backend: replay over kept-sets, advantages, correction, loss);
3. publish the weights every ``publish_every_steps`` steps (and after the last), numbered by the backend's version, so
   token versions and trainer versions share one scale;
4. health monitors over the step's metrics and texts (alarms reach ``hooks.on_alarm``);
5. ``hooks.on_resolved`` learns which groups the step trained and dropped (``relayrl run`` writes its
   exactly-once ledger there) *before* the checkpoint that records the buffer cursor past them;
   checkpoint (backend, buffer cursor, monitors, RNG, groups consumed) in the background, every
   ``checkpoint_every`` steps and after the last one (:meth:`TrainingLoop.checkpoint_pending`: a
   stopped loop's last step); metrics; progress (the fleet's back-pressure signal).

The loop is the leader's part of data-parallel training too: :class:`relayrl.trainer.ranked_loop.RankedLoop`
runs the collective step on every rank and hands the leader's result to :meth:`TrainingLoop.finish_step`.
The collaborators are typed by the small protocols below; relayrl's buffer, weight-sync publisher,
fault-tolerance checkpointer and metrics writer implement them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from relayrl.algo.determinism import rng_state, set_rng_state
from relayrl.core.errors import StoreError

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import Monitor, RewardShaper
    from relayrl.trainer.hookspecs import TrainerBackend

__all__ = ["BatchSource", "Checkpointer", "LoopHooks", "MetricsSink", "StepResult", "TrainingLoop", "WeightPublisher",
           "checkpoint_due", "publish_due"]

log = logging.getLogger(__name__)

REPUBLISH_CHECK_S = 5.0
"""How often a trainer with nothing to train checks whether to publish its weights again
(:meth:`TrainingLoop.republish_reason`): each check may list the store."""


class BatchSource(Protocol):
    """Where batches come from (:class:`relayrl.buffer.Buffer`)."""

    @property
    def pending(self) -> int: ...

    def wait_for_batch(self, trainer_version: int, *, timeout_s: float | None = None) -> Any: ...

    def resolve_drops(self, trainer_version: int) -> Sequence[Any]: ...

    def restore(self, state: Any, *, rebalance: bool = True) -> None: ...


class WeightPublisher(Protocol):
    """Where weights go (:class:`relayrl.weight_sync.Publisher`)."""

    next_version: int
    last_report: Any
    failed_version: int | None
    last_error: BaseException | None

    def publish(self, tensors: Mapping[str, Any], *, step: int = 0, version: int | None = None) -> Any: ...

    def committed(self, version: int) -> bool: ...

    def adopt(self, version: int, tensors: Mapping[str, Any]) -> bool: ...

    def repair_requested(self) -> bool: ...

    def behind(self) -> bool: ...


class Checkpointer(Protocol):
    """Where checkpoints go (:class:`relayrl.fault_tolerance.checkpoint.AsyncCheckpointer`).

    ``save`` returns once the state is copied (its result's ``blocking_s`` says how long that took)
    and writes it in the background; ``last_write_s`` and ``last_write_bytes`` describe the newest
    finished write (0 before the first)."""

    last_write_s: float
    last_write_bytes: int

    def save(self, step: int, state: dict[str, Any]) -> Any: ...


class MetricsSink(Protocol):
    """Where each step's metrics go (:class:`relayrl.trainer.metrics.MetricsWriter`)."""

    def write(self, step: int, metrics: dict[str, float]) -> None: ...


class LoopHooks:
    """What the process around the loop adds to a step; every hook does nothing by default."""

    def before_commit(self) -> None:
        """Right before the step's results are committed (``relayrl run`` checks its run lease here)."""

    def extra_metrics(self) -> dict[str, float]:
        """Metrics from outside the trainer to record with the step (the fleet's, the engines')."""
        return {}

    def on_resolved(self, step: int, trained: list[str], dropped: list[tuple[str, str]]) -> None:
        """The groups this step trained on and dropped (with why), before its checkpoint is written."""

    def on_alarm(self, step: int, alarm: Any) -> None:
        """A health monitor raised ``alarm`` on this step."""

    def on_step(self, step: int, version: int, metrics: dict[str, float], alarms: list[Any]) -> None:
        """The step is committed: checkpointed (in the background), its metrics written."""

    def on_waiting(self, waiting_since: float, dropped: Mapping[str, int]) -> None:
        """No batch is ready (called every ``wait_timeout_s`` while waiting)."""

    def on_renumbered(self, version: int, published_as: int) -> None:
        """The weights of ``version`` went out as ``published_as``: the bus held other bits under that
        number (a resume that did not reproduce the crashed run's step, or a non-deterministic run)."""


def publish_due(step: int, every: int, steps: int) -> bool:
    """Whether the weights are published after ``step``: every ``every``-th step, and the last of ``steps``
    (0: no last step), so that a finished run's final weights are on the bus (``relayrl eval RUN_DIR``)."""
    return step % every == 0 or (bool(steps) and step >= steps)


def checkpoint_due(step: int, every: int, steps: int) -> bool:
    """Whether ``step`` is checkpointed when committed: every ``every``-th step, and the last of ``steps``
    (0: no last step). Every rank of a data-parallel trainer decides by this, so their shards agree."""
    return step % every == 0 or (bool(steps) and step >= steps)


@dataclass
class StepResult:
    """One committed step."""

    step: int
    version: int
    metrics: dict[str, float]
    alarms: list[Any] = field(default_factory=list)


class TrainingLoop:
    """The trainer's loop over a buffer of scored groups (see the module docstring)."""

    def __init__(self, backend: TrainerBackend, *, buffer: BatchSource, publisher: WeightPublisher,
                 checkpointer: Checkpointer, monitors: Monitor, metrics: MetricsSink,
                 progress: Callable[[int, int, dict[str, int]], None],
                 shapers: Sequence[RewardShaper] = (), publish_every_steps: int = 1, steps: int = 0,
                 hooks: LoopHooks | None = None, wait_timeout_s: float = 0.5, reproducible: bool = False,
                 checkpoint_every: int = 1) -> None:
        self.backend = backend
        self.buffer = buffer
        self.publisher = publisher
        self.checkpointer = checkpointer
        self.monitors = monitors
        self.metrics = metrics
        self.progress = progress
        """Called with (step, version, groups consumed per producer) whenever they change."""
        self.shapers = list(shapers)
        self.publish_every_steps = publish_every_steps
        self.steps = steps
        """Steps to train in all (0: until stopped)."""
        self.hooks = hooks or LoopHooks()
        self.wait_timeout_s = wait_timeout_s
        self.reproducible = reproducible
        """Deterministic training: a resumed loop redoes the crashed run's steps bit for bit, so it keeps
        its version numbers (the same bits under the same numbers; the buffer admits the same groups)."""
        self.checkpoint_every = checkpoint_every
        """Steps between checkpoints; a loop resumed from one redoes the steps since (see the module docstring)."""
        self._unsaved: dict[str, Any] | None = None  # the last step's state while its checkpoint is not due
        self.step = 0
        self.consumed: Counter[str] = Counter()
        self._progress_failing = False  # the last progress write failed (logged once per outage)
        self._drained: Counter[str] = Counter()  # dropped while waiting for the next batch, by reason
        self._drained_refs: list[tuple[str, str]] = []
        self._waiting_since: float | None = None

    # ------------------------------------------------------------------ state
    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint :meth:`finish_step` wrote (the backend restores its own part)."""
        self.step = int(state["step"])
        # A reproducible loop redoes the lost steps on the same batches: no re-balancing of the backlog
        # (which draws the batches after a restore stratified to the running mix).
        self.buffer.restore(state["buffer"], rebalance=not self.reproducible)
        self.monitors.restore(state["monitors"])
        self.consumed = Counter(state["consumed"])
        set_rng_state(state["rng"])

    def write_progress(self) -> None:
        """Tell the fleet where training is (its step, version and consumption). Advisory and replaced
        by the next write: a store that refuses it for a while (an outage) is logged once and the loop
        goes on."""
        try:
            self.progress(self.step, self.backend.version, dict(self.consumed))
        except StoreError as exc:
            if not self._progress_failing:
                log.warning("could not write the trainer's progress to the bus (%s); retrying while it waits", exc)
            self._progress_failing = True
        else:
            self._progress_failing = False

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.step >= self.steps

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> Any:
        """The next batch at the backend's version, or None after ``wait_timeout_s`` (then groups that
        can never be trained are settled, and ``hooks.on_waiting`` hears how long it has waited)."""
        batch = self.buffer.wait_for_batch(self.backend.version, timeout_s=self.wait_timeout_s)
        if batch is not None:
            self._waiting_since = None
            return batch
        self.settle_drops()
        if self._waiting_since is None:
            self._waiting_since = time.time()
        self.hooks.on_waiting(self._waiting_since, dict(self._drained))
        return None

    def settle_drops(self) -> None:
        """Count groups that will never be trained (too stale) as consumed, so the fleet, held back by
        its lead over the consumed count, produces fresh ones instead of waiting for the trainer."""
        drops = self.buffer.resolve_drops(self.backend.version)
        for drop in drops:
            self.consumed[drop.ref.producer_id] += 1
            self._drained[drop.reason] += 1
            self._drained_refs.append((str(drop.ref), drop.reason))
        if drops or self._progress_failing:  # a write an outage refused is made again: the fleet waits on it
            self.write_progress()

    @staticmethod
    def groups_of(batch: Any) -> tuple[list[Any], list[float] | None]:
        """The groups to train on, and their weights (None when every group counts fully)."""
        weights = [item.weight for item in batch.groups]  # < 1 for groups the buffer down-weighted (stale)
        return [item.group for item in batch.groups], None if all(weight == 1.0 for weight in weights) else weights

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` is checkpointed as soon as it is committed (see :func:`checkpoint_due`)."""
        return checkpoint_due(step, self.checkpoint_every, self.steps)

    def checkpoint_pending(self) -> float:
        """Checkpoint the last committed step if it is not yet (a stopped loop calls this before it
        ends, so a stop loses nothing); the seconds the save blocked (0.0 when there was nothing to save)."""
        if self._unsaved is None:
            return 0.0
        state, self._unsaved = self._unsaved, None
        return float(self.checkpointer.save(state["step"], {**state, "trainer": self.backend.state_dict()}).blocking_s)

    def publishes_after(self, step: int) -> bool:
        """Whether the weights are published after ``step`` (see :func:`publish_due`)."""
        return publish_due(step, self.publish_every_steps, self.steps)

    # ------------------------------------------------------------------ steps
    def train_step(self, batch: Any) -> StepResult:
        """One whole step in this process: the backend's step, then :meth:`finish_step`."""
        started = time.monotonic()
        groups, weights = self.groups_of(batch)
        metrics = self.backend.step(groups, weights=weights)
        publish = self.publishes_after(self.step + 1)
        tensors = dict(self.backend.named_full_state()) if publish else None
        return self.finish_step(batch, metrics, weights=tensors, started=started)

    def finish_step(self, batch: Any, metrics: dict[str, float], *, weights: Mapping[str, Any] | None,
                    started: float) -> StepResult:
        """Commit a step the backend has taken on ``batch``: publish ``weights`` (when given), monitor,
        resolve its groups, checkpoint, write metrics and progress."""
        self.step += 1
        self.hooks.before_commit()  # nothing of this step is committed unless the process may still commit
        for ref in [item.ref for item in batch.groups] + [item.ref for item in batch.dropped]:
            self.consumed[ref.producer_id] += 1
        metrics.update(batch.metrics.as_dict())
        for reason, count in self._drained.items():  # dropped while waiting for this batch
            name = f"buffer/dropped/{reason}"
            metrics[name] = metrics.get(name, 0.0) + count
        self._drained.clear()
        for shaper in self.shapers:
            metrics.update(shaper.metrics(self.step))
        if weights is not None:
            self._publish(weights, wait=False)
        report = self.publisher.last_report
        if report is not None:
            metrics.update({"weight_sync/publish_s": report.copy_s + report.encode_s + report.upload_s + report.commit_s,
                            "weight_sync/copy_s": report.copy_s, "weight_sync/delta_ratio": report.ratio,
                            "weight_sync/stored_bytes": float(report.stored_bytes),
                            "weight_sync/version": float(report.version)})
        metrics.update(self.hooks.extra_metrics())
        texts = [turn.text or "" for item in batch.groups for trajectory in item.group.trajectories
                 for segment in trajectory.segments for turn in segment.turns if turn.role == "assistant"]
        added, alarms = self.monitors.observe(self.step, metrics, texts)
        metrics.update(added)
        for alarm in alarms:
            self.hooks.on_alarm(self.step, alarm)
        # What this step's checkpoint (its buffer cursor) resolves since the previous one, told first.
        self.hooks.on_resolved(self.step, [str(item.ref) for item in batch.groups],
                               self._drained_refs + [(str(item.ref), item.reason) for item in batch.dropped])
        self._drained_refs = []
        # The loop's part of the state as it is at this step's end; the backend's does not change until the
        # next step, so a checkpoint that is not due yet is written from here when the loop stops.
        self._unsaved = {"step": self.step, "buffer": msgspec.to_builtins(batch.state),
                         "monitors": self.monitors.state(), "rng": rng_state(), "consumed": dict(self.consumed)}
        if self.checkpoint_due(self.step):
            metrics["checkpoint/blocking_s"] = self.checkpoint_pending()
        # The newest finished background write (relayrl-fault-tolerance's checkpointer reports it): what a
        # checkpoint costs beyond the blocking copy, in CPU and disk the next steps share with it.
        if self.checkpointer.last_write_bytes:
            metrics["checkpoint/write_s"] = float(self.checkpointer.last_write_s)
            metrics["checkpoint/bytes"] = float(self.checkpointer.last_write_bytes)
        metrics["trainer/wall_step_s"] = time.monotonic() - started
        self.metrics.write(self.step, metrics)
        self.write_progress()
        self.hooks.on_step(self.step, self.backend.version, metrics, alarms)
        return StepResult(self.step, self.backend.version, metrics, alarms)

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event | None = None) -> int:
        """Train until ``steps`` are done or ``stop`` is set (checked between steps); returns the step.

        Single process; the weights are published first (engines bootstrap from them), numbered above
        every version on the bus. While waiting for data, the current weights are published again when
        the last publish failed (:meth:`republish_reason`).
        """
        stop = stop or threading.Event()
        self.publish_current()
        republish_checked = 0.0
        while not stop.is_set() and not self.done:
            batch = self.next_batch()
            if batch is not None:
                self.train_step(batch)
            elif time.monotonic() - republish_checked > REPUBLISH_CHECK_S:
                republish_checked = time.monotonic()
                reason = self.republish_reason()
                if reason:
                    self.republish(reason)
        self.checkpoint_pending()
        return self.step

    def republish_reason(self) -> str | None:
        """Why a starved trainer should publish its weights again, or None.

        When the newest publish failed (a store outage), the engines stay at the last committed
        version while the trainer moved on: every group they make is stale, no step comes to publish
        again, and the run would wait for good. When an engine asked for a repair (it could not
        verify what it fetched), it waits for a fresh snapshot. Either way: publish the weights as they
        are now, under a new number."""
        if self.publisher.behind():
            return (f"the weight store did not take version {self.publisher.failed_version} "
                    f"({self.publisher.last_error}); the engines stayed behind")
        if self.publisher.repair_requested():
            return "an engine could not verify the published weights"
        return None

    def republish(self, reason: str, weights: Mapping[str, Any] | None = None) -> Exception | None:
        """Publish the current weights (``weights``, gathered by the caller from every rank, else the
        backend's) under a new number (a fresh snapshot). None when published; else what the store
        said (logged; the next check tries again)."""
        try:
            self.publish_start(dict(self.backend.named_full_state()) if weights is None else weights, renumber=True)
        except Exception as exc:
            log.warning("%s; publishing the weights again failed too (%s): retrying in %.0f s", reason, exc,
                        REPUBLISH_CHECK_S)
            return exc
        log.warning("%s; published the weights again as version %d", reason, int(self.backend.version))
        return None

    def publish_current(self, *, renumber: bool = False) -> int:
        """Publish the weights as they are now (at start-up: engines bootstrap from them); the version."""
        return self.publish_start(dict(self.backend.named_full_state()), renumber=renumber)

    def publish_start(self, weights: Mapping[str, Any], *, renumber: bool = False) -> int:
        """At start-up (fresh or resumed), or with ``renumber`` to answer a repair request (a fresh
        snapshot under a new number): publish ``weights``, the whole model; the version they are
        published under.

        Reproducible (deterministic) training keeps the backend's version at start-up: versions the
        crashed run published after its checkpoint will be redone with the same bits, so they stand,
        and nothing is republished (the same bits are on the bus under the number already). Otherwise
        the weights go out numbered above every version on the bus (newer versions hold other weights).
        """
        if renumber or not self.reproducible:
            self.backend.version = max(int(self.backend.version), int(self.publisher.next_version))
        self._publish(weights, wait=True, start=True)
        self.write_progress()
        return int(self.backend.version)

    def _publish(self, weights: Mapping[str, Any], *, wait: bool, start: bool = False) -> None:
        version = int(self.backend.version)
        if version < self.publisher.next_version:  # the bus went further: a resumed, reproducible loop
            if self.publisher.adopt(version, weights):
                return  # a redone step: exactly these bits are that version already
            if start and not self.publisher.committed(version):
                return  # a version the run never published (every K steps): the newer ones stand
            self.backend.version = int(self.publisher.next_version)
            self.hooks.on_renumbered(version, int(self.backend.version))
        future = self.publisher.publish(weights, step=self.step, version=self.backend.version)
        if wait:
            future.result()
