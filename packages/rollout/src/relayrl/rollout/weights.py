"""Keeping an engine's weights current: relayrl-weight-sync's controller driving the torch engine.

:class:`TorchEngineAdapter` is weight-sync's :class:`~relayrl.weight_sync.EngineAdapter` over a
:class:`TorchEngine`: the engine's own pause (between decode steps) brackets every apply, tensors
are written in place through the model's state dict, and the served version the engine stamps on
every token is the one the controller verified. :func:`start_controller` runs a
:class:`~relayrl.weight_sync.Controller` in a background thread: it prefetches and verifies new
versions from the bus while the engine serves, then pauses it briefly to apply.
"""

from __future__ import annotations

import threading
from typing import Any

from relayrl.core.store import Store
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.weight_sync import Controller, StateDictAdapter

__all__ = ["TorchEngineAdapter", "start_controller"]


class TorchEngineAdapter(StateDictAdapter):
    """weight-sync's engine protocol for a :class:`TorchEngine`."""

    def __init__(self, engine: TorchEngine, *, threads: int = 0) -> None:
        super().__init__(engine.model, version=engine.served_version, threads=threads)
        self.engine = engine

    def pause(self) -> None:
        self.engine.pause()  # returns once no decode step is running
        self._paused = True
        self.pauses += 1

    def resume(self) -> None:
        self._require_paused()
        self._paused = False
        self.engine.resume()

    def reset_caches(self) -> None:
        self.engine.reset_cache()
        self.cache_resets += 1

    def set_served_version(self, version: int | None) -> None:
        self.version = version
        if version is not None:
            self.engine.set_served_version(version)


def start_controller(engine: TorchEngine, store: Store, *, prefix: str = "weights", poll_interval_s: float = 0.5,
                     **options: Any) -> tuple[Controller, threading.Event, threading.Thread]:
    """Run a controller for ``engine`` on ``store`` in a daemon thread; set the event to stop it."""
    controller = Controller(store, TorchEngineAdapter(engine), prefix=prefix, poll_interval_s=poll_interval_s,
                            reset_caches_on_apply=True, **options)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), name=f"{engine.engine_id}-weights", daemon=True)
    thread.start()
    return controller, stop, thread
