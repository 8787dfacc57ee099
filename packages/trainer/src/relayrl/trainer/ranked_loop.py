"""The training loop across the trainer's ranks: what ``relayrl run``'s trainer process runs.

:class:`~relayrl.trainer.loop.TrainingLoop` is one process's trainer. With ``[trainer] ranks`` > 1
every rank holds (a shard of) the model and takes part in each optimiser step, but only the leader
(rank 0) talks to the buffer and the bus. :class:`RankedLoop` is that arrangement, once:

* the leader decides what every rank does next (:class:`~relayrl.trainer.ranks.Decision`: train on
  the next batch, publish the weights again, wait, stop) with its ``TrainingLoop``, and broadcasts it;
* every rank takes the step; gathering the weights to publish and writing the checkpoint shard are
  collective, at the cadence the leader's loop uses (:func:`~relayrl.trainer.loop.checkpoint_due`);
* the leader's loop commits the rest (publish, monitors, books, checkpoint, metrics, progress).

With a world of one it is exactly ``TrainingLoop.run``, plus the republishing a starved trainer does.

Elastic ranks (``[trainer] elastic``, :mod:`relayrl.trainer.elastic`): the leader admits ranks that are
ready at step boundaries; a rank that dies in a collective costs the step, which the survivors redo on
the same batch after the group re-forms; a rank other than 0 runs :meth:`RankedLoop.follow`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from relayrl.algo.determinism import rng_state
from relayrl.trainer.elastic import LeaderGone, View, describe_failure
from relayrl.trainer.loop import REPUBLISH_CHECK_S, Checkpointer, TrainingLoop, checkpoint_due, publish_due
from relayrl.trainer.ranks import Decision

__all__ = ["MAX_REDO", "RankHooks", "RankedLoop"]

MAX_REDO = 5
"""Elastic ranks: attempts at one step (or one decision) whose collective keeps failing, after which
the failure is taken for what it is (a bug, not a lost rank) and the trainer process exits."""


class RankHooks:
    """What the process around a :class:`RankedLoop` adds; every hook does nothing by default."""

    def on_tick(self) -> None:
        """Every turn of the leader's loop (at least every ``wait_timeout_s``): a sign of life."""

    def on_republished(self, reason: str, version: int, failure: Exception | None) -> None:
        """The leader published its weights again because of ``reason`` (``failure``: the store refused)."""

    def on_elastic_change(self, kind: str, message: str, data: dict[str, Any]) -> None:
        """The elastic group grew, shrank or re-formed (``data``: who, the world size, how long it took)."""

    def before_follower_step(self, name: str, step: int) -> None:
        """An elastic rank other than 0 is about to take part in ``step`` (fault injection hooks here)."""


class RankedLoop:
    """The trainer's loop on one rank (see the module docstring).

    ``backend``: this rank's trainer backend (None on an elastic follower until it is admitted);
    ``ranks``: :class:`~relayrl.trainer.ranks.Ranks` or :class:`~relayrl.trainer.elastic.ElasticRanks`;
    ``loop``: the leader's ``TrainingLoop`` (None on the other ranks); ``checkpointer``: where a rank
    other than the leader writes its shard (None where it writes none: an elastic follower);
    ``step``: the step a resumed rank other than the leader continues from (the leader's loop knows its own).
    """

    def __init__(self, backend: Any, *, ranks: Any, loop: TrainingLoop | None, checkpointer: Checkpointer | None,
                 stop: threading.Event, steps: int = 0, checkpoint_every: int = 1, publish_every_steps: int = 1,
                 step: int = 0, hooks: RankHooks | None = None) -> None:
        self.backend = backend
        self.ranks = ranks
        self.loop = loop
        self.checkpointer = checkpointer
        self.stop = stop
        self.steps = steps
        self.checkpoint_every = checkpoint_every
        self.publish_every_steps = publish_every_steps
        self.hooks = hooks or RankHooks()
        self._step = step  # the step of a rank without the loop
        self._unsaved: dict[str, Any] | None = None  # a rank's last step while its checkpoint is not due
        self._batch: Any = None  # the leader's batch behind the current "train" decision
        self._repair_checked = 0.0  # when the waiting leader last looked for a reason to publish again
        self._republish_reason: str | None = None

    @property
    def step(self) -> int:
        """Steps trained (the loop's count on the leader)."""
        return self.loop.step if self.loop is not None else self._step

    @step.setter
    def step(self, value: int) -> None:
        if self.loop is not None:
            self.loop.step = value
        else:
            self._step = value

    # ------------------------------------------------------------------ weights
    def gather_weights(self) -> dict[str, Any] | None:
        """The whole model to publish, on the leader (None elsewhere); every rank must call it: a
        sharded backend gathers each tensor collectively (``named_full_state``)."""
        tensors = {}
        for name, tensor in self.backend.named_full_state():
            if self.ranks.leader:
                tensors[name] = tensor
        return tensors if self.ranks.leader else None

    def publish_current(self, *, renumber: bool = False, reason: str = "") -> None:
        """Publish the weights as they are now (every rank calls it); the leader's loop decides the
        version (``TrainingLoop.publish_start``) and every rank adopts it.

        With ``reason`` (a starved trainer publishing again: ``TrainingLoop.republish_reason``), a store
        that refuses them is reported to ``hooks.on_republished`` and retried at the next check."""
        weights = self.gather_weights()
        version = None
        if self.loop is not None and not reason:
            version = self.loop.publish_start(weights or {}, renumber=renumber)
        elif self.loop is not None:
            failure = self.loop.republish(reason, weights)
            version = int(self.loop.backend.version)
            self.hooks.on_republished(reason, version, failure)
        # Elastic ranks take the version with the leader's state when they (re)join.
        self.backend.version = version if self.ranks.elastic else self.ranks.broadcast(version)

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Before the first step: publish the current weights (engines bootstrap from them) and, with
        elastic ranks, open the group to ranks that are ready."""
        self.publish_current()
        if self.ranks.elastic:
            self._open_elastic_group()

    def run(self) -> int:
        """Train until the leader stops (``steps`` done, or ``stop`` set); the last step is checkpointed
        when its checkpoint was not due. Returns the step."""
        while True:
            if self.ranks.leader:
                self.hooks.on_tick()
            if self.ranks.elastic:
                decision = self._next_elastic_decision()
            else:
                decision = self.ranks.broadcast_decision(self._decide() if self.ranks.leader else None)
            if decision.kind == "stop":
                self.checkpoint_pending()  # every rank: the last step, when it fell between checkpoints
                return self.step
            if decision.kind == "train":
                self._train_on(decision)
            elif decision.kind == "republish":
                self.publish_current(renumber=True, reason=self._republish_reason or "republishing")

    def _decide(self) -> Decision:
        """The leader's next move: stop, train on the next batch, or wait (settling stale groups)."""
        assert self.loop is not None
        if self.stop.is_set() or (self.steps and self.step >= self.steps):
            return Decision("stop")
        batch = self.loop.next_batch()  # settles what can never be trained while it waits
        if batch is None:
            # Starved, perhaps because the engines never got the newest weights (the store refused
            # them) or cannot build them (a corrupt object): no step is coming to publish again.
            if time.monotonic() - self._repair_checked > REPUBLISH_CHECK_S:
                self._repair_checked = time.monotonic()
                self._republish_reason = self.loop.republish_reason()
                if self._republish_reason:
                    return Decision("republish")
            return Decision("wait")
        self._batch = batch
        groups, weights = self.loop.groups_of(batch)
        return Decision("train", groups, weights)

    def _train_on(self, decision: Decision) -> None:
        """One step on every rank; the leader's loop commits it."""
        started = time.monotonic()
        if self.ranks.elastic:
            metrics = self._step_elastically(decision)
        else:
            metrics = self.backend.step(decision.groups, weights=decision.weights)
        publish = publish_due(self.step + 1, self.publish_every_steps, self.steps)
        weights = self.gather_weights() if publish else None
        if self.loop is None:  # a rank other than the leader: its shard of the checkpoint, at the leader's cadence
            self.step += 1
            self._unsaved = {"step": self.step, "rng": rng_state()}
            if checkpoint_due(self.step, self.checkpoint_every, self.steps):
                self.checkpoint_pending()
            return
        batch, self._batch = self._batch, None
        self.loop.finish_step(batch, metrics, weights=weights, started=started)

    def checkpoint_pending(self) -> None:
        """Checkpoint the last step if its checkpoint was not due (``checkpoint_every``)."""
        if self.loop is not None:
            self.loop.checkpoint_pending()
        elif self._unsaved is not None and self.checkpointer is not None:
            state, self._unsaved = self._unsaved, None
            self.checkpointer.save(state["step"], {**state, "trainer": self.backend.state_dict()})

    # ------------------------------------------------------------------ elastic ranks (the leader)
    def _open_elastic_group(self) -> None:
        """The leader is ready to train: ranks may build, announce themselves and be admitted."""
        self.ranks.get_state = lambda: {"trainer": self.backend.state_dict(), "step": self.step}
        self.ranks.on_change = self.hooks.on_elastic_change
        self.ranks.open()

    def _next_elastic_decision(self) -> Decision:
        """Admit ranks that are ready (a step boundary), decide, and tell every member of the group."""
        view = self.ranks.newcomers()
        if view is not None:
            failure = None
            try:
                if self.ranks.world > 1:  # the current members switch groups with the newcomers
                    self.ranks.broadcast_decision(Decision("regroup", view=view.encode()))
            except RuntimeError as error:
                failure = describe_failure(error)
            # Recovery happens out of the except block (see describe_failure).
            if failure is not None:
                self.ranks.recover(failure)
            else:
                self.ranks.grow(view)
        decision = self._decide()
        if decision.kind == "stop":
            with contextlib.suppress(RuntimeError):  # a rank that is gone needs no telling
                self.ranks.broadcast_decision(decision)
            return decision
        self._share(decision)
        return decision

    def _share(self, decision: Decision) -> None:
        """Broadcast ``decision`` to the group, re-forming it (without the dead) until that works."""
        for attempt in range(MAX_REDO + 1):
            if self.ranks.world == 1:
                return
            try:
                self.ranks.broadcast_decision(decision)
                return
            except RuntimeError as error:
                if attempt == MAX_REDO:
                    raise
                failure = describe_failure(error)
            self.ranks.recover(failure)  # out of the except block (see describe_failure)

    def _step_elastically(self, decision: Decision) -> dict[str, float]:
        """The step on the group; when a rank dies in it, the survivors redo it on the same batch."""
        for attempt in range(MAX_REDO + 1):
            try:
                metrics: dict[str, float] = self.backend.step(decision.groups, weights=decision.weights)
                break
            except RuntimeError as error:  # the backend left no gradient behind (its contract)
                if self.ranks.world == 1 or attempt == MAX_REDO:
                    raise
                failure = describe_failure(error)
            self.ranks.recover(failure)  # out of the except block (see describe_failure)
            self._share(decision)
        metrics.update({"elastic/world_size": float(self.ranks.world), "elastic/regroups": float(self.ranks.regroups),
                        "elastic/generation": float(self.ranks.view.generation), "elastic/redone": float(attempt)})
        return metrics

    # ------------------------------------------------------------------ elastic ranks (the others)
    def follow(self, new_backend: Callable[[int], Any]) -> int:
        """An elastic rank other than 0: train in the leader's group whenever admitted, taking the
        leader's state each time a group forms (``new_backend(version)`` builds this rank's backend the
        first time). Returns 0 when the leader stops the group or its process ends."""

        def take(state: dict[str, Any]) -> None:
            if self.backend is None:
                self.backend = new_backend(int(state["trainer"]["version"]))
            self.backend.load_state_dict(state["trainer"])
            self.step = int(state["step"])

        self.ranks.set_state = take
        failures: Counter[int] = Counter()  # failed attempts per leader step
        while True:
            try:
                self.ranks.join()
            except LeaderGone:
                return 0
            try:
                while True:
                    decision = self.ranks.broadcast_decision(None)
                    if decision.kind == "stop":
                        self.ranks.close()
                        return 0
                    if decision.kind == "train":
                        self.hooks.before_follower_step(self.ranks.name, self.step + 1)
                        self.backend.step(decision.groups, weights=decision.weights)
                        self.step += 1
                    elif decision.kind == "regroup" and not self.ranks.follow_view(View.decode(decision.view)):
                        break  # the new group did not form: wait to be admitted again
            except RuntimeError as failure:  # a rank (maybe the leader) died mid-collective
                failures[self.step] += 1
                if failures[self.step] > MAX_REDO:  # the same step failing again and again is no lost rank
                    raise
                print(f"trainer: collective failed at step {self.step + 1} ({type(failure).__name__}); rejoining",
                      file=sys.stderr, flush=True)
