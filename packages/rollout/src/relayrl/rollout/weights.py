"""Keeping an engine's weights current: relayrl-weight-sync's controller driving an inference engine.

Two adapters turn an engine into weight-sync's :class:`~relayrl.weight_sync.EngineAdapter`:

* :class:`TorchEngineAdapter`, for the built-in :class:`TorchEngine`: the engine's parameters are
  plain tensors, so deltas are decoded straight into them (zero copy), with the engine's own pause
  (between decode steps) around every apply.
* :class:`ShadowAdapter`, for any other :class:`~relayrl.rollout.protocol.WeightSyncTarget` (the
  vLLM plugin): engines that repack their weights (fused QKV, CPU-friendly layouts) cannot expose
  the trainer's tensors bit for bit, so the adapter keeps a *shadow* copy of them in checkpoint
  format on the CPU. Deltas are decoded and verified against the shadow while the engine serves;
  during the pause the changed tensors are handed to the engine's ``apply_named_tensors`` (which
  loads them the way its checkpoint loader would). Cost: one CPU copy of the weights per engine.

An engine chooses its adapter with an optional ``weight_sync_adapter()`` method;
:func:`adapter_for` falls back to the two above. :func:`start_controller` runs a
:class:`~relayrl.weight_sync.Controller` in a background thread: it prefetches and verifies new
versions from the bus while the engine serves, then pauses it briefly to apply.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from relayrl.core.store import Store
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import WeightSyncTarget
from relayrl.weight_sync import Controller, EngineAdapter, StateDictAdapter
from relayrl.weight_sync.config import WeightSyncSection

__all__ = ["ShadowAdapter", "TorchEngineAdapter", "adapter_for", "apply_timings", "start_controller"]


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


class ShadowAdapter(StateDictAdapter):
    """weight-sync's engine protocol for any :class:`WeightSyncTarget`, through a CPU shadow of its weights.

    ``shadow`` maps the trainer's tensor names to CPU tensors holding exactly the weights the
    engine serves now (typically loaded from the same model directory). Updates land in the shadow
    first (decoded, XORed and checksum-verified there); when the controller records the new
    version, the tensors that changed are pushed to the engine with
    ``target.apply_named_tensors(changed, version)``, while it is paused.
    """

    def __init__(self, target: WeightSyncTarget, shadow: Mapping[str, Any], *, push: str = "changed",
                 threads: int = 0) -> None:
        if push not in ("changed", "all"):
            raise ValueError(f"push must be 'changed' or 'all', got {push!r}")
        super().__init__(dict(shadow), version=target.served_version, threads=threads)
        self.target = target
        self.push = push
        """``changed``: push only tensors whose bits changed; ``all``: every tensor on every update (for
        engines whose loaders repack groups of tensors together and cannot take a partial set)."""
        self.pushes = 0
        self._changed: set[str] = set()
        self._push_all = False

    def pause(self) -> None:
        self.target.pause()
        super().pause()

    def apply_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        # Only tensors whose bits differ are pushed: frozen or untouched tensors cost the engine nothing.
        self._changed.update(name for name, bits in tensors.items() if not np.array_equal(self.read_bits(name), bits))
        super().apply_tensors(tensors)

    def apply_xor(self, deltas: Mapping[str, np.ndarray]) -> None:
        super().apply_xor(deltas)
        # An all-zero delta leaves the tensor as it was: not pushed (frozen or untouched tensors).
        self._changed.update(name for name, delta in deltas.items() if delta.any())

    def set_served_version(self, version: int | None) -> None:
        self.version = version
        if version is None:
            # A failed apply or push: the shadow, the engine or both hold bits of no known version (a
            # push can fail partway). The controller keeps the engine paused; its next update is a
            # snapshot into the shadow, pushed whole to the engine.
            self._push_all = True
            return
        # Also when nothing changed: the engine must stamp its tokens with the new version.
        everything = self.push == "all" or self._push_all
        names = sorted(self.tensors) if everything else sorted(self._changed)
        self.target.apply_named_tensors({name: self.tensors[name] for name in names}, version)
        self._changed.clear()
        self._push_all = False
        self.pushes += 1

    def reset_caches(self) -> None:
        self.target.reset_cache()
        self.cache_resets += 1

    def resume(self) -> None:
        super().resume()
        self.target.resume()


def adapter_for(engine: Any) -> EngineAdapter:
    """The weight-sync adapter of ``engine``: its own ``weight_sync_adapter()``, or a built-in one."""
    if hasattr(engine, "weight_sync_adapter"):
        return engine.weight_sync_adapter()
    if isinstance(engine, TorchEngine):
        return TorchEngineAdapter(engine)
    raise TypeError(f"{type(engine).__name__} takes no weight updates: it has no weight_sync_adapter() "
                    f"and is not a TorchEngine")


def start_controller(engine: Any, store: Store, section: WeightSyncSection | None = None,
                     **overrides: Any) -> tuple[Controller, threading.Event, threading.Thread]:
    """Run a controller for ``engine`` on ``store`` in a daemon thread; set the event to stop it.

    The controller is configured by ``section`` (the run's ``[weight_sync]``; its defaults when
    None): prefix, poll interval, apply mode, verification, cache resets, threads, and ``stage_url``
    (then it reads the node mirror instead of ``store``). ``overrides`` win.
    """
    name = getattr(engine, "engine_id", "engine")
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
