"""The trainer process of ``relayrl run``: ``python -m relayrl.cli.run.trainer_process RUN_DIR``.

A host around relayrl-trainer's loop (:class:`~relayrl.trainer.ranked_loop.RankedLoop` over the leader's
:class:`~relayrl.trainer.loop.TrainingLoop`: batch → step → publish → monitors → checkpoint → metrics →
progress, on every rank); this module builds its parts from the run's config and directory. Start-up: materialise the model directory;
recover the newest complete checkpoint (relayrl-fault-tolerance), or else run the supervised
warm-up; publish the current weights so that engines can bootstrap (a fresh publisher's first
version is a full snapshot); write ``progress``. What the run adds to each step (:class:`RunHooks`):
the run lease is checked before anything is committed, the step's line is appended to the ledger
(groups trained and dropped: see :mod:`.ledger`) before its checkpoint, alarms become events, the
fleet's and the engines' metrics join the trainer's, and the status the display reads is written.

SIGTERM or SIGINT ends the run after the current step, with its checkpoint written.

With ``[trainer] ranks`` > 1 the launcher starts one such process per data-parallel rank (a backend
that trains as one of several ranks, e.g. DeepSpeed ZeRO); rank 0 leads and the others follow its
decisions (see :mod:`relayrl.trainer.ranked_loop`). With ``[trainer] elastic`` the leader starts alone
and admits the other ranks at step boundaries; a rank that dies shrinks the group, the survivors redo
the step, and the rank rejoins once the launcher has restarted it (see :mod:`relayrl.trainer.elastic`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from relayrl.algo.config import build_monitors, build_reward_shapers
from relayrl.algo.determinism import enable_determinism, seed_everything, set_rng_state
from relayrl.buffer import Buffer, FleetMetrics, Progress, write_progress
from relayrl.cli.run.events import write_event
from relayrl.cli.run.layout import RunLayout
from relayrl.cli.run.lease import EXIT_FENCED, LeaseLost, check_fence
from relayrl.cli.run.ledger import LedgerWriter
from relayrl.core.config import Config
from relayrl.core.plugins import PluginManager, get_plugin_manager
from relayrl.core.store import open_store
from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer
from relayrl.fault_tolerance.faults import maybe_kill
from relayrl.fault_tolerance.recovery import recover
from relayrl.rollout.config import build_environment
from relayrl.rollout.models import load_model, load_tokenizer, make_chat_format, materialize_model
from relayrl.trainer.elastic import ElasticRanks
from relayrl.trainer.hookspecs import TRAINER_BACKENDS
from relayrl.trainer.loop import LoopHooks, TrainingLoop
from relayrl.trainer.metrics import MetricsWriter
from relayrl.trainer.ranked_loop import RankedLoop, RankHooks
from relayrl.trainer.ranks import Ranks
from relayrl.trainer.warmup import MaskedExample, supervised_warmup
from relayrl.weight_sync import ConcurrentWriter, Publisher

__all__ = ["TrainerProcess", "main"]

class StoppedDuringWarmup(Exception):
    """A stop was asked for during the supervised warm-up, which can take minutes: the trainer stops
    at once instead of finishing it (nothing is published or checkpointed yet, so nothing is lost;
    a resumed run starts the warm-up again)."""


class TrainerProcess:
    """The trainer side of a run (see the module docstring)."""

    def __init__(self, layout: RunLayout, config: Config, *, pm: PluginManager | None = None, ranks: Ranks | None = None) -> None:
        self.layout = layout
        self.config = config
        self.pm = pm
        self.ranks = ranks or Ranks()
        self.stop = threading.Event()
        self.bus = layout.bus(config)
        self.loop: TrainingLoop | None = None  # the leader's; other ranks only step and save their shard
        self.ranked: RankedLoop | None = None  # every rank's, once its backend is built
        self.hooks = RunHooks(self)
        self.colocated: Any = None
        """The rollout fleet on a thread of this process (``[rollout] colocate``), once started."""
        self._resumed_step = 0  # the checkpoint's step, for a resumed rank other than the leader

    @property
    def step(self) -> int:
        """Steps trained."""
        if self.ranked is not None:
            return self.ranked.step
        return self.loop.step if self.loop is not None else self._resumed_step

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
        factory = TRAINER_BACKENDS.lookup(self.pm, self.config.trainer.backend).factory
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
            self._resumed_step = int(state["step"])
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
            hooks=self.hooks, reproducible=self.config.run.deterministic,
            checkpoint_every=self.config.trainer.checkpoint_every)

    def _start_colocated_fleet(self) -> None:
        """``[rollout] colocate``: the engine (on the trainer's own parameters) and the rollout manager on
        a thread of this process (see :mod:`relayrl.cli.run.colocate`)."""
        from relayrl.cli.run.colocate import ColocatedFleet, colocation_problem

        problem = colocation_problem(self.config)
        if problem:
            raise SystemExit(f"trainer: {problem}")
        self.colocated = ColocatedFleet(self.layout, self.config, self.trainer, pm=self.pm)
        self.colocated.on_failure = self.stop.set  # the loop stops after its step; run() then exits non-zero
        self.colocated.start()

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
        self.ranked = RankedLoop(
            self.trainer, ranks=self.ranks, loop=self.loop, checkpointer=getattr(self, "checkpointer", None),
            stop=self.stop, steps=total, checkpoint_every=self.config.trainer.checkpoint_every,
            publish_every_steps=self.config.weight_sync.publish_every_steps, step=self._resumed_step, hooks=self.hooks)
        self.ranked.start()  # publish the current weights; elastic: open the group
        if self.config.rollout.colocate:
            self._start_colocated_fleet()
        if leader:
            self.layout.write_status("trainer", {"phase": "training", "step": self.step, "steps": total})
        started.set()  # from here the loop itself gives the signs: a loop that hangs gives none
        try:
            self.ranked.run()
        finally:
            if self.colocated is not None:
                self.colocated.stop()
            self._close()
        if self.colocated is not None and self.colocated.error is not None:
            raise SystemExit(f"trainer: the colocated fleet failed ({type(self.colocated.error).__name__}: "
                             f"{self.colocated.error}); stopped after a checkpoint, a restart resumes from it")
        if leader:
            finished = total and self.step >= total
            self.layout.write_status("trainer", {"phase": "finished" if finished else "stopped", "step": self.step,
                                                 "steps": total})
        self.ranks.close()
        return 0

    def follow(self) -> int:
        """An elastic rank other than 0: wait for the leader, then train in its group whenever admitted
        (:meth:`RankedLoop.follow`). Returns 0 when the leader stops the group or its process ends."""
        self.ranks.wait_for_leader()
        self._build()
        self.ranked = RankedLoop(None, ranks=self.ranks, loop=None, checkpointer=None, stop=self.stop, hooks=self.hooks)
        return self.ranked.follow(self._new_trainer)

    def _close(self) -> None:
        for name in ("checkpointer", "publisher", "metrics", "ledger", "buffer"):  # the leader holds them all
            part = getattr(self, name, None)
            if part is not None:
                part.close()


class RunHooks(LoopHooks, RankHooks):
    """What ``relayrl run`` adds to each step of the leader's loop and to every rank's (see the module
    docstring)."""

    def __init__(self, process: TrainerProcess) -> None:
        self.process = process
        self._waiting_reported = 0.0
        self._beaten = 0.0  # when the leader last gave a sign of life (``RunLayout.beat``)

    def on_tick(self) -> None:
        if time.monotonic() - self._beaten > 1.0:  # the launcher's liveness check reads it
            self._beaten = time.monotonic()
            self.process.layout.beat("trainer")

    def on_republished(self, reason: str, version: int, failure: Exception | None) -> None:
        write_event(self.process.layout, "trainer", "weights-unpublished" if failure else "weights-republished",
                    f"{reason}; publishing them again failed too ({failure}); retrying" if failure
                    else f"{reason}; published the weights again as version {version}", level="warning")

    def on_elastic_change(self, kind: str, message: str, data: dict[str, Any]) -> None:
        write_event(self.process.layout, "trainer", "elastic", message, level="warning" if kind != "grew" else "info",
                    data={"change": kind, "step": self.process.step, **data})

    def before_follower_step(self, name: str, step: int) -> None:
        # Fault injection (tests): die while the others are in this step's collectives.
        maybe_kill(f"{name}-in-step", step)

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
