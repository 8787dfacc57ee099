"""Keeping an engine's weights current: relayrl-weight-sync's controller driving an inference engine.

An engine says how it takes weights with :meth:`~relayrl.rollout.protocol.InferenceEngine.weight_adapter`,
which returns weight-sync's :class:`~relayrl.weight_sync.EngineAdapter`: the built-in
:class:`~relayrl.rollout.engines.torch_engine.TorchEngine` returns a
:class:`~relayrl.rollout.engines.torch_engine.TorchEngineAdapter` (deltas decoded straight into its
parameters); the vLLM plugin's engine, which repacks its weights, returns a
:class:`~relayrl.weight_sync.ShadowAdapter` over itself. :func:`start_controller` runs a
:class:`~relayrl.weight_sync.Controller` in a background thread: it prefetches and verifies new
versions from the bus while the engine serves, then pauses it briefly to apply.
"""

from __future__ import annotations

import threading
from typing import Any

from relayrl.core.store import Store
from relayrl.rollout.protocol import InferenceEngine
from relayrl.weight_sync import Controller, EngineAdapter
from relayrl.weight_sync.config import WeightSyncSection

__all__ = ["adapter_for", "apply_timings", "start_controller"]


def adapter_for(engine: InferenceEngine) -> EngineAdapter:
    """The weight-sync adapter of ``engine`` (its :meth:`~InferenceEngine.weight_adapter`)."""
    adapter = engine.weight_adapter()
    if adapter is None:
        raise TypeError(f"{type(engine).__name__} takes no weight updates (its weight_adapter() is None)")
    return adapter


def start_controller(engine: InferenceEngine, store: Store, section: WeightSyncSection | None = None,
                     **overrides: Any) -> tuple[Controller, threading.Event, threading.Thread]:
    """Run a controller for ``engine`` on ``store`` in a daemon thread; set the event to stop it.

    The controller is configured by ``section`` (the run's ``[weight_sync]``; its defaults when
    None): prefix, poll interval, apply mode, verification, cache resets, threads, and ``stage_url``
    (then it reads the node mirror instead of ``store``). ``overrides`` win.
    """
    name = engine.engine_id
    overrides.setdefault("reporter", name)  # names the engine in the repair requests it files
    controller = Controller.from_config(store, adapter_for(engine), section or WeightSyncSection(), **overrides)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), name=f"{name}-weights", daemon=True)
    thread.start()
    return controller, stop, thread


def apply_timings(controller: Controller) -> dict[str, Any]:
    """The engine's last weight update as its health reports it: seconds of each phase, whether it
    is held paused (a failed apply) or stuck on a version no route verifies (a repair asked for), and
    how its controller applies versions (``settings``: what it was built with)."""
    info: dict[str, Any] = {"held_paused": controller.held_paused, "broken_version": controller.broken,
                            "settings": controller.settings()}
    if controller.reports:
        last = controller.reports[-1]
        info.update(version=last.version, route=last.route, fetch_s=round(last.fetch_s, 4),
                    decode_s=round(last.decode_s, 4), pause_s=round(last.pause_s, 4), apply_s=round(last.apply_s, 4),
                    total_s=round(last.total_s, 4), updates=len(controller.reports))
    return info
