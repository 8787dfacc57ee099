"""``[rollout] colocate``: the engine and the rollout manager inside the trainer's process.

On one machine the plainest RL loop holds one model: it samples, grades and trains in one process.
Colocation gives ``relayrl run`` that shape while keeping everything else of a run (the durable
buffer on the bus, the exactly-once ledger, checkpoints, the token-recording proxy, staleness
admission, the synchronous mode):

* the engine is a :class:`~relayrl.rollout.engines.torch_engine.TorchEngine` over a *view* of the
  trainer's model (:func:`shared_view`): its own module objects (its own eval mode, its own routing
  hooks) whose parameters and buffers are the trainer's tensors, so there is no second copy of the
  weights and no weight delta;
* the update is the optimiser step itself: the trainer backend enters its ``weight_guard`` around
  every change of the parameters (:meth:`ColocatedFleet.guard`), which pauses the engine at a decode
  step boundary, and on the way out stamps the engine with the trainer's new version (and drops its
  kept prefixes when ``[weight_sync] reset_caches_on_apply``). Every token thus records the version
  whose weights sampled it, as with weight sync: in-flight requests carry on with the new weights;
* the rollout manager (:func:`relayrl.cli.run.rollout_process.run_rollout`) runs on its own event loop
  in a thread (:class:`ColocatedFleet`), grading in sandboxes as always, and commits groups to the bus,
  where the trainer's buffer reads them.

The weights still go to the bus every ``[weight_sync] publish_every_steps`` steps (the launcher waits
for the first; ``relayrl eval RUN_DIR@VERSION`` reads them); set it higher to skip that cost.

A failure of the fleet thread stops the trainer after its step (checkpointed), and the process exits
non-zero, so the launcher restarts it; it resumes from that checkpoint like any trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from relayrl.core.config import Config, resolve_plugin_keywords
from relayrl.core.plugins import PluginManager

__all__ = ["ColocatedFleet", "colocation_problem", "shared_view"]


def colocation_problem(config: Config) -> str | None:
    """Why ``config`` cannot colocate (one line naming the dotted key), or None when it can or does not ask to.
    (``[rollout]`` checks its own part: one torch engine.)"""
    if not config.rollout.colocate:
        return None
    if config.trainer.backend != "torch":
        return (f"rollout.colocate: the engine shares the torch trainer's parameters; trainer.backend = "
                f"{config.trainer.backend!r} keeps its own (use backend = \"torch\", or colocate = false)")
    if config.trainer.ranks != 1:
        return f"rollout.colocate: needs trainer.ranks = 1 (got {config.trainer.ranks}): one process holds both"
    serving = config.rollout.serving_dtype(config.model)
    if serving != config.model.dtype:
        return (f"rollout.colocate: the engine serves the trainer's own tensors, in model.dtype = "
                f"{config.model.dtype!r}; rollout.engine_dtype = {serving!r} needs a converted copy (colocate = false)")
    return None


def shared_view(model: torch.nn.Module) -> torch.nn.Module:
    """A second module tree over ``model``'s very tensors: the same parameters and buffers (so every
    in-place optimiser update shows in both), its own modules (so ``eval()`` on it, or a hook registered
    on it, leaves ``model`` alone)."""
    tensors = {id(tensor): tensor for tensor in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=dict(tensors))


class ColocatedFleet:
    """The rollout manager and its engine on a thread of the trainer's process (see the module docstring)."""

    def __init__(self, layout: Any, config: Config, trainer: Any, *, pm: PluginManager | None = None) -> None:
        from relayrl.rollout.engines.torch_engine import TorchEngine
        from relayrl.rollout.hookspecs import ENGINES

        self.layout = layout
        self.config = config
        self.trainer = trainer
        self.pm = pm
        section = config.rollout
        _, options = resolve_plugin_keywords(pm, ENGINES, section.engine, section.engine_options, path="rollout.engine")
        self.engine = TorchEngine(shared_view(trainer.model), engine_id="engine-0", version=int(trainer.version),
                                  max_batch=section.max_batch, seed=config.run.seed, **options)
        self.reset_caches = config.weight_sync.reset_caches_on_apply
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        """What ended the fleet thread, when it failed."""
        self.on_failure: Callable[[], None] = lambda: None
        """Called from the fleet thread when it fails (the trainer process stops its loop)."""
        self._thread = threading.Thread(target=self._run, name="colocated-fleet", daemon=True)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """The trainer backend's ``weight_guard``: the engine paused (between two decode steps) while the
        parameters change, then stamped with the trainer's version."""
        self.engine.pause()
        try:
            yield
        finally:
            self.engine.set_served_version(int(self.trainer.version))
            if self.reset_caches:
                self.engine.reset_caches()  # KV computed by the old weights is not reused for new requests
            self.engine.resume()

    def start(self) -> None:
        self.trainer.weight_guard = self.guard
        self._thread.start()

    def _run(self) -> None:
        from relayrl.cli.run.rollout_process import run_rollout

        try:
            asyncio.run(run_rollout(self.layout, self.config, [], pm=self.pm, engines=[self.engine],
                                    stop=self.stop_event))
        except BaseException as exc:
            self.error = exc
            traceback.print_exc()
            self.on_failure()
        else:
            if not self.stop_event.is_set():  # the manager ended by itself: nothing will feed the trainer
                self.error = RuntimeError("the colocated rollout manager stopped on its own")
                self.on_failure()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the fleet (complete groups committed, in-flight ones dropped) and wait for its thread."""
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.trainer.weight_guard = contextlib.nullcontext
