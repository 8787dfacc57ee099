"""The trainer process of ``relayrl run``: ``python -m relayrl.cli.run.trainer_process RUN_DIR``.

Process glue around relayrl-trainer's :class:`~relayrl.trainer.loop.TrainingLoop` (batch → step →
publish → monitors → checkpoint → metrics → progress). Start-up: materialise the model directory;
recover the newest complete checkpoint (relayrl-fault-tolerance), or else run the supervised
warm-up; publish the current weights so that engines can bootstrap (a fresh publisher's first
version is a full snapshot); write ``progress``. What the run adds to each step (:class:`RunHooks`):
the run lease is checked before anything is committed, the step's line is appended to the ledger
(groups trained and dropped: see :mod:`.ledger`) before its checkpoint, alarms become events, the
fleet's and the engines' metrics join the trainer's, and the status the display reads is written.

SIGTERM or SIGINT ends the run after the current step, with its checkpoint written.

With ``[trainer] ranks`` > 1 the launcher starts one such process per data-parallel rank (a backend
that trains as one of several ranks, e.g. DeepSpeed ZeRO); rank 0 leads and the others follow its
decisions (see :mod:`relayrl.trainer.ranks`). With ``[trainer] elastic`` the leader starts alone and
admits the other ranks at step boundaries; a rank that dies shrinks the group, the survivors redo the
step, and the rank rejoins once the launcher has restarted it (see :mod:`relayrl.trainer.elastic`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from relayrl.algo.config import build_monitors, build_reward_shapers
from relayrl.algo.determinism import enable_determinism, rng_state, seed_everything, set_rng_state
from relayrl.buffer import Buffer, FleetMetrics, Progress, write_progress
from relayrl.cli.run.events import write_event
from relayrl.cli.run.layout import RunLayout
from relayrl.cli.run.lease import EXIT_FENCED, LeaseLost, check_fence
from relayrl.cli.run.ledger import LedgerWriter
from relayrl.core.config import Config
from relayrl.core.plugins import get_plugin_manager, lookup
from relayrl.core.store import open_store
from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer
from relayrl.fault_tolerance.faults import maybe_kill
from relayrl.fault_tolerance.recovery import recover
from relayrl.rollout.config import build_environment
from relayrl.rollout.models import load_model, load_tokenizer, make_chat_format, materialize_model
from relayrl.trainer.elastic import ElasticRanks, LeaderGone, View, describe_failure
from relayrl.trainer.loop import REPUBLISH_CHECK_S, LoopHooks, TrainingLoop, checkpoint_due
from relayrl.trainer.metrics import MetricsWriter
from relayrl.trainer.ranks import Decision, Ranks
from relayrl.trainer.warmup import MaskedExample, supervised_warmup
from relayrl.weight_sync import ConcurrentWriter, Publisher

__all__ = ["TrainerProcess", "main"]

MAX_REDO = 5
"""Elastic ranks: attempts at one step (or one decision) whose collective keeps failing, after which
the failure is taken for what it is (a bug, not a lost rank) and the trainer process exits."""


class StoppedDuringWarmup(Exception):
    """A stop was asked for during the supervised warm-up, which can take minutes: the trainer stops
    at once instead of finishing it (nothing is published or checkpointed yet, so nothing is lost;
    a resumed run starts the warm-up again)."""


class TrainerProcess:
    """The trainer side of a run (see the module docstring)."""

    def __init__(self, layout: RunLayout, config: Config, *, pm: Any = None, ranks: Ranks | None = None) -> None:
        self.layout = layout
        self.config = config
        self.pm = pm
        self.ranks = ranks or Ranks()
        self.stop = threading.Event()
        self.bus = layout.bus(config)
        self.loop: TrainingLoop | None = None  # the leader's; other ranks only step and save their shard
        self._step = 0  # the step of a rank without the loop
        self._rank_unsaved: dict[str, Any] | None = None  # its last step's state while the checkpoint is not due
        self._batch: Any = None  # the leader's batch behind the current "train" decision
        self._repair_checked = 0.0  # when the waiting leader last looked for a reason to publish again
        self._republish_reason: str | None = None
        self._beaten = 0.0  # when the leader last gave a sign of life (``RunLayout.beat``)

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

    # ------------------------------------------------------------------ start-up
    def _build(self) -> None:
        config = self.config
        if config.run.deterministic:
            enable_determinism(config.run.seed, num_threads=config.trainer.threads or None)
        else:
            seed_everything(config.run.seed)
            if config.trainer.threads:
                torch.set_num_threads(config.trainer.threads)
        self.environment = build_environment(config.rollout, sandbox=self.layout.sandbox_section(config), pm=self.pm)
        if not self.ranks.leader:
            self.ranks.barrier()  # the leader writes a fresh model directory first
        model_dir = materialize_model(config.model, self.layout.model_dir,
                                      alphabet=self.environment.alphabet, specials=self.environment.specials,
                                      seed=config.run.seed)
        if self.ranks.leader:
            self.ranks.barrier()
        self.tokenizer = load_tokenizer(model_dir)
        self.chat = make_chat_format(config.model, self.tokenizer)
        self.model = load_model(model_dir, dtype=config.model.dtype)
        peers = [open_store(url) for url in config.trainer.checkpoint_peers]
        if self.ranks.elastic and not self.ranks.leader:
            return  # an elastic rank takes the leader's state when it joins: no checkpoint, no books
        # Elastic ranks: the leader holds the whole state, so its checkpoint alone is complete.
        rank, world = (0, 1) if self.ranks.elastic else (self.ranks.rank, self.ranks.world)
        self.checkpointer = AsyncCheckpointer(self.layout.checkpoint_store(), peers=peers, rank=rank,
                                              world_size=world, keep=config.trainer.checkpoint_keep)
        if self.ranks.leader:  # only the leader talks to the bus and writes the run's records
            self.buffer = Buffer(self.bus, config.buffer, pm=self.pm)
            self.monitors = build_monitors(config.algo, pm=self.pm)
            # The fleet applies the shapers; the trainer records their state per step (the length
            # penalty's phase), so a report can tell budget steps from unconstrained ones.
            self.shapers = build_reward_shapers(config.algo, pm=self.pm)
            self.metrics = MetricsWriter(self.layout.root)
            self.ledger = LedgerWriter(self.layout.root)
            self.fleet = FleetMetrics(self.bus)

    def _new_trainer(self, version: int) -> Any:
        factory = lookup(self.pm, "relayrl_trainer_backends", self.config.trainer.backend, kind="trainer backend").factory
        return factory(self.model, algo=self.config.algo, config=self.config.trainer, version=version, pm=self.pm,
                       run_config=self.config)

    def _warmup(self) -> None:
        section = self.config.trainer.warmup
        if section.steps <= 0:
            return
        started = time.monotonic()
        examples = self._demonstrations()

        def progress(step: int, loss: float) -> None:
            if self.stop.is_set():
                raise StoppedDuringWarmup(f"stopped during the supervised warm-up, at step {step + 1} of "
                                          f"{section.steps}; a resumed run starts it again")
            self.layout.write_status("trainer", {"phase": "warmup", "step": step + 1, "steps": section.steps,
                                                 "loss": loss})

        if self.stop.is_set():
            raise StoppedDuringWarmup("stopped before the supervised warm-up; a resumed run starts it")

        threads = torch.get_num_threads()
        if section.threads:
            torch.set_num_threads(section.threads)
        try:
            losses = supervised_warmup(self.model, examples, section, seed=self.config.run.seed,
                                       pad_token_id=getattr(self.tokenizer, "pad_token_id", 0) or 0, on_step=progress)
        finally:
            torch.set_num_threads(threads)
        write_event(self.layout, "trainer", "warmup", f"supervised warm-up: {section.steps} steps, loss "
                    f"{losses[0]:.3f} -> {losses[-1]:.3f} in {time.monotonic() - started:.1f} s",
                    data={"steps": section.steps, "first_loss": losses[0], "last_loss": losses[-1]})

    def _demonstrations(self) -> list[Any]:
        """The warm-up's examples: multi-turn expert trajectories, or single answers, from the environment."""
        from relayrl.rollout.agent import iter_segments
        from relayrl.rollout.config import build_harness
        from relayrl.rollout.evaluation import split_tasks

        # Multi-turn: played through the run's own harness and real sandboxed tools (minutes, when
        # every demonstration is graded: the kernels' are), so a stop cancels them.
        self.layout.write_status("trainer", {"phase": "demonstrations"})
        trajectories = asyncio.run(self._until_stopped(
            self.environment.demonstrate(harness=build_harness(self.config.rollout, pm=self.pm), chat=self.chat,
                                         tokenizer=self.tokenizer),
            "stopped while the warm-up's demonstrations were played; a resumed run plays them again"))
        if trajectories is not None:
            return [MaskedExample(tokens, trained) for trajectory in trajectories
                    for tokens, trained in iter_segments(trajectory)]
        end = self.chat.stop_token_ids()
        training, _ = split_tasks(self.environment)  # never the held-out tasks
        answers = [self.environment.demonstration(task) for task in training]
        if not training or any(answer is None for answer in answers):
            raise SystemExit(f"trainer.warmup.steps = {self.config.trainer.warmup.steps}, but environment "
                             f"{self.config.rollout.environment!r} has no demonstrations")
        return [(self.chat.render("user", task.instruction) + self.chat.assistant_prefix(),
                 self.chat.tokenizer.encode(answer) + end[:1]) for task, answer in zip(training, answers)]

    async def _until_stopped(self, work: Any, message: str, poll_s: float = 0.2) -> Any:
        """Await ``work``, cancelling it (and raising :class:`StoppedDuringWarmup` with ``message``) once
        a stop is asked for. A blocking call it runs in a thread (a grading) finishes first: a few seconds."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await asyncio.wait({task}, timeout=poll_s)
            if self.stop.is_set() and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise StoppedDuringWarmup(message)
        return task.result()

    def _recover(self) -> Any:
        recovered = recover(self.checkpointer.local, self.checkpointer.peers)
        if self.ranks.world > 1:
            # Every rank must resume the same step; one that saw an older checkpoint decides.
            found = recovered.step if recovered is not None else 0
            agreed = self.ranks.agree_on_min(found)
            if agreed != found:
                recovered = recover(self.checkpointer.local, self.checkpointer.peers, at_most=agreed)
            if (recovered.step if recovered is not None else 0) != agreed:
                raise SystemExit(f"rank {self.ranks.rank}: no checkpoint of step {agreed}, which another rank resumes")
        # The steps after this one are redone: this rank's files of them (a step not every rank committed,
        # or one that no longer verifies) would block their commits.
        self.checkpointer.discard_after(recovered.step if recovered is not None else 0)
        return recovered

    def _restore_or_start(self) -> None:
        recovered = self._recover()
        if recovered is None:
            if self.ranks.leader:
                self._warmup()
            self.ranks.broadcast_module(self.model)  # every rank starts from the leader's weights
            # Version 1 is the model the fleet starts from (after the warm-up); RL steps count on from it.
            self.trainer = self._new_trainer(version=1)
            self._start_loop()
            return
        state = recovered.state
        self.trainer = self._new_trainer(version=int(state["trainer"]["version"]))
        self.trainer.load_state_dict(state["trainer"])
        if not self.ranks.leader:
            set_rng_state(state["rng"])
            self.step = int(state["step"])
            return
        self._start_loop()
        self.loop.restore(state)  # step, buffer cursor, monitors, groups consumed, RNG
        write_event(self.layout, "trainer", "resumed", f"resumed from the checkpoint of step {self.step} "
                    f"({recovered.source})", data={"step": self.step})
        if recovered.discarded:  # the user must know that training was lost and is redone
            steps = ", ".join(map(str, recovered.discarded))
            write_event(self.layout, "trainer", "checkpoint", f"checkpoint(s) of step(s) {steps} failed verification "
                        f"on every replica and were discarded: resumed from step {self.step}, the steps after it "
                        "are trained again", level="warning", data={"step": self.step, "discarded": recovered.discarded})

    def _weights(self) -> dict[str, torch.Tensor] | None:
        """The whole model to publish, on the leader (None elsewhere); every rank must call it.

        Every backend yields it tensor by tensor (``named_full_state``: a sharded backend gathers
        each, collectively under ZeRO-3).
        """
        tensors = {}
        for name, tensor in self.trainer.named_full_state():
            if self.ranks.leader:
                tensors[name] = tensor
        return tensors if self.ranks.leader else None

    def _start_loop(self) -> None:
        """The leader's training loop, over the backend just built (other ranks have none)."""
        if not self.ranks.leader:
            return
        # Low-precision rollouts: the engines' dtype is what gets published (the trainer keeps its own).
        serving = self.config.rollout.serving_dtype(self.config.model)
        self.publisher = Publisher.from_config(self.bus, self.config.weight_sync,
                                               publish_dtype=serving if serving != self.config.model.dtype else None)
        self.loop = TrainingLoop(
            self.trainer, buffer=self.buffer, publisher=self.publisher, checkpointer=self.checkpointer,
            monitors=self.monitors, metrics=self.metrics, shapers=self.shapers,
            progress=lambda step, version, consumed: write_progress(
                self.bus, Progress(step=step, version=version, consumed=consumed)),
            publish_every_steps=self.config.weight_sync.publish_every_steps, steps=self.config.trainer.steps,
            hooks=RunHooks(self), reproducible=self.config.run.deterministic,
            checkpoint_every=self.config.trainer.checkpoint_every)

    def _publish_current(self, *, renumber: bool = False, reason: str = "") -> None:
        """Publish the weights as they are now (every rank calls it: gathering them is collective); the
        leader's loop decides the version (see ``TrainingLoop.publish_start``) and every rank adopts it.

        With ``reason`` (a starved trainer publishing again: ``TrainingLoop.republish_reason``), a
        store that refuses them is said in an event and retried at the next check, not raised."""
        weights = self._weights()
        version = None
        if self.loop is not None and not reason:
            version = self.loop.publish_start(weights, renumber=renumber)
        elif self.loop is not None:
            failure = self.loop.republish(reason, weights)
            version = int(self.loop.backend.version)
            write_event(self.layout, "trainer", "weights-unpublished" if failure else "weights-republished",
                        f"{reason}; publishing them again failed too ({failure}); retrying" if failure
                        else f"{reason}; published the weights again as version {version}", level="warning")
        # Elastic ranks take the version with the leader's state when they (re)join.
        self.trainer.version = version if self.ranks.elastic else self.ranks.broadcast(version)

    def _beat_until(self, started: threading.Event) -> None:
        while not started.wait(1.0):
            self.layout.beat("trainer")

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        if self.ranks.elastic and not self.ranks.leader:
            return self.follow()
        self.ranks.init()
        self._build()
        leader = self.ranks.leader
        total = self.config.trainer.steps
        if leader:
            self.layout.write_status("trainer", {"phase": "starting"})
        # Signs of life while it starts (loading, restoring, warming up: no loop yet) come from a thread:
        # a stopped process gives none; a deadlock at start-up is left to start_timeout_s.
        started = threading.Event()
        if leader:
            threading.Thread(target=self._beat_until, args=(started,), name="trainer-beat", daemon=True).start()
        try:
            self._restore_or_start()
        except StoppedDuringWarmup as stopped:
            write_event(self.layout, "trainer", "stopped", str(stopped))
            self.layout.write_status("trainer", {"phase": "stopped", "step": 0, "steps": total})
            self._close()
            self.ranks.close()
            return 0
        self._publish_current()
        if leader:
            self.layout.write_status("trainer", {"phase": "training", "step": self.step, "steps": total})
        if self.ranks.elastic:
            self._open_elastic_group()
        started.set()  # from here the loop itself gives the signs: a loop that hangs gives none
        try:
            while True:
                if leader and time.monotonic() - self._beaten > 1.0:  # the launcher's liveness check reads it
                    self._beaten = time.monotonic()
                    self.layout.beat("trainer")
                if self.ranks.elastic:
                    decision = self._next_elastic_decision(total)
                else:
                    decision = self.ranks.broadcast_decision(self._decide(total) if leader else None)
                if decision.kind == "stop":
                    self._checkpoint_pending()  # every rank: the last step, when it fell between checkpoints
                    break
                if decision.kind == "train":
                    self._train_on(decision)
                elif decision.kind == "republish":
                    self._publish_current(renumber=True, reason=self._republish_reason or "republishing")
        finally:
            self._close()
        if leader:
            finished = total and self.step >= total
            self.layout.write_status("trainer", {"phase": "finished" if finished else "stopped", "step": self.step,
                                                 "steps": total})
        self.ranks.close()
        return 0

    def _decide(self, total: int) -> Decision:
        """The leader's next move: stop, train on the next batch, or wait (settling stale groups)."""
        if self.stop.is_set() or (total and self.step >= total):
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
        """One step on every rank: the optimiser step, gathering the weights to publish and the checkpoint
        shard are collective; the leader's loop commits the rest (books, publishing, checkpoint)."""
        started = time.monotonic()
        if self.ranks.elastic:
            metrics = self._step_elastically(decision)
        else:
            metrics = self.trainer.step(decision.groups, weights=decision.weights)
        publish = (self.step + 1) % self.config.weight_sync.publish_every_steps == 0
        weights = self._weights() if publish else None
        if self.loop is None:  # a rank other than the leader: its shard of the checkpoint, at the leader's cadence
            self.step += 1
            self._rank_unsaved = {"step": self.step, "rng": rng_state()}
            if checkpoint_due(self.step, self.config.trainer.checkpoint_every, self.config.trainer.steps):
                self._checkpoint_pending()
            return
        batch, self._batch = self._batch, None
        self.loop.finish_step(batch, metrics, weights=weights, started=started)

    def _checkpoint_pending(self) -> None:
        """Checkpoint the last step if its checkpoint was not due (``trainer.checkpoint_every``)."""
        if self.loop is not None:
            self.loop.checkpoint_pending()
        elif self._rank_unsaved is not None:
            state, self._rank_unsaved = self._rank_unsaved, None
            self.checkpointer.save(state["step"], {**state, "trainer": self.trainer.state_dict()})

    # ------------------------------------------------------------------ elastic ranks (the leader)
    def _open_elastic_group(self) -> None:
        """The leader is ready to train: ranks may build, announce themselves and be admitted."""
        self.ranks.get_state = lambda: {"trainer": self.trainer.state_dict(), "step": self.step}

        def changed(kind: str, message: str, data: dict[str, Any]) -> None:
            write_event(self.layout, "trainer", "elastic", message, level="warning" if kind != "grew" else "info",
                        data={"change": kind, "step": self.step, **data})

        self.ranks.on_change = changed
        self.ranks.open()

    def _next_elastic_decision(self, total: int) -> Decision:
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
        decision = self._decide(total)
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
                metrics = self.trainer.step(decision.groups, weights=decision.weights)
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
    def follow(self) -> int:
        """An elastic rank other than 0: wait for the leader, then train in its group whenever admitted.

        Returns 0 when the leader stops the group or its process ends (the launcher decides the rest).
        """
        self.ranks.wait_for_leader()
        self._build()
        self.trainer = None

        def take(state: dict[str, Any]) -> None:
            if self.trainer is None:
                self.trainer = self._new_trainer(version=int(state["trainer"]["version"]))
            self.trainer.load_state_dict(state["trainer"])
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
                        # Fault injection (tests): die while the others are in this step's collectives.
                        maybe_kill(f"{self.ranks.name}-in-step", self.step + 1)
                        self.trainer.step(decision.groups, weights=decision.weights)
                        self.step += 1
                    elif decision.kind == "regroup" and not self.ranks.follow_view(View.decode(decision.view)):
                        break  # the new group did not form: wait to be admitted again
            except RuntimeError as failure:  # a rank (maybe the leader) died mid-collective
                failures[self.step] += 1
                if failures[self.step] > MAX_REDO:  # the same step failing again and again is no lost rank
                    raise
                print(f"trainer: collective failed at step {self.step + 1} ({type(failure).__name__}); rejoining",
                      file=sys.stderr, flush=True)

    def _close(self) -> None:
        for name in ("checkpointer", "publisher", "metrics", "ledger", "buffer"):  # the leader holds them all
            part = getattr(self, name, None)
            if part is not None:
                part.close()


class RunHooks(LoopHooks):
    """What ``relayrl run`` adds to each step of the leader's loop (see the module docstring)."""

    def __init__(self, process: TrainerProcess) -> None:
        self.process = process
        self._waiting_reported = 0.0

    def before_commit(self) -> None:
        # Nothing of this step is committed (weights, ledger, checkpoint) once a newer launcher runs the run.
        check_fence(self.process.bus)

    def extra_metrics(self) -> dict[str, float]:
        rollout = _numeric(self.process.layout.read_status("rollout").get("metrics", {}))
        return {**self.process.fleet.read(), **rollout}

    def on_resolved(self, step: int, trained: list[str], dropped: list[tuple[str, str]]) -> None:
        # The ledger line of this step lists what its checkpoint's buffer cursor resolves since the previous one.
        self.process.ledger.write(step, trained, dropped)

    def on_alarm(self, step: int, alarm: Any) -> None:
        write_event(self.process.layout, "trainer", "alarm", alarm.message, level="warning",
                    data={"step": step, "monitor": alarm.monitor, "metric": alarm.metric, "value": alarm.value})

    def on_step(self, step: int, version: int, metrics: dict[str, float], alarms: list[Any]) -> None:
        self.process.layout.write_status("trainer", {"phase": "training", "step": step,
                                                     "steps": self.process.config.trainer.steps, "version": version,
                                                     "alarms": [alarm.message for alarm in alarms]})

    def on_renumbered(self, version: int, published_as: int) -> None:
        write_event(self.process.layout, "trainer", "weights-renumbered",
                    f"the weights of version {version} went out as version {published_as}: the bus already held "
                    f"other weights under that number", level="warning" if self.process.config.run.deterministic else "info",
                    data={"version": version, "published_as": published_as})

    def on_waiting(self, waiting_since: float, dropped: Mapping[str, int]) -> None:
        """While no batch is ready: say since when, and what the buffer did with what arrived (the
        progress line shows it: every group dropped as zero-variance, none arriving at all ...)."""
        now = time.time()
        if now - self._waiting_reported < 2.0:
            return
        self._waiting_reported = now
        process = self.process
        process.layout.write_status("trainer", {
            "phase": "training", "step": process.step, "steps": process.config.trainer.steps,
            "version": process.trainer.version, "waiting_since": waiting_since,
            "pending_groups": process.buffer.pending, "batch_groups": process.config.buffer.batch_groups,
            "dropped_while_waiting": dict(dropped)})


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a status's metrics, as floats (the others are not metrics)."""
    return {name: float(value) for name, value in metrics.items() if isinstance(value, (int, float))}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m relayrl.cli.run.trainer_process RUN_DIR", file=sys.stderr)
        return 2
    pm = get_plugin_manager()
    layout = RunLayout(argv[0])
    ranks = Ranks.from_env()
    config = layout.load_config(pm=pm)
    if config.trainer.elastic and ranks.world > 1:
        ranks = ElasticRanks(layout.root, "trainer" if ranks.leader else f"trainer-{ranks.rank}", leader=ranks.leader)
    process = TrainerProcess(layout, config, pm=pm, ranks=ranks)
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Only the leader decides to stop (after its step and checkpoint); the other ranks follow it.
        signal.signal(signum, (lambda *_: process.stop.set()) if ranks.leader else signal.SIG_IGN)
    try:
        code = process.run()
    except (LeaseLost, ConcurrentWriter) as exc:  # a second writer on this run's bus: restarting cannot help
        print(f"trainer: {exc}", file=sys.stderr, flush=True)
        code = EXIT_FENCED
    if getattr(ranks, "stuck", False):  # an elastic group given up on still waits in gloo: do not wait with it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
