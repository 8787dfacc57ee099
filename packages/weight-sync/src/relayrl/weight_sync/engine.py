"""The engine side of an update: one protocol, spelt once, and the adapters that implement it.

A controller needs an engine to: name its tensors and read their current bits (the base a delta is
applied onto), pause, take new bits (copied in place, or XORed in place), optionally drop its
prefix/KV caches, record the version it serves, and resume. That is :class:`EngineAdapter`.

Every engine that takes weights shares four of those operations (:class:`PausableEngine`:
``served_version``, ``pause``, ``resume``, ``reset_caches``), spelt the same everywhere. An engine
exposes its weights to the controller in one of two ways:

* its tensors are plain memory the controller can write: the engine (or a thin wrapper such as
  :class:`StateDictAdapter`, for a ``torch.nn.Module``, a torch state dict or numpy arrays) *is* an
  :class:`EngineAdapter`; deltas are decoded straight into the served weights;
* it repacks its weights (fused QKV, CPU-friendly layouts) and can only *load* named tensors the way
  its checkpoint loader does: it is a :class:`WeightLoader` (``load_weights``), and
  :class:`ShadowAdapter` turns it into an :class:`EngineAdapter` by keeping a CPU shadow of the
  checkpoint-format tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from relayrl.weight_sync import bits as tensor_bits
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool

__all__ = ["EngineAdapter", "PausableEngine", "ShadowAdapter", "StateDictAdapter", "WeightLoader"]


@runtime_checkable
class PausableEngine(Protocol):
    """What every engine that takes weights has, whichever way it takes them."""

    @property
    def served_version(self) -> int | None:
        """The weight version the engine serves now; None when unknown (fresh, or after a failed apply)."""

    def pause(self) -> None:
        """Stop starting new forward passes; return once none is running (in-flight sequences keep
        their KV caches)."""

    def resume(self) -> None:
        """Start serving again."""

    def reset_caches(self) -> None:
        """Drop prefix/KV caches computed with the old weights (called while paused)."""


@runtime_checkable
class EngineAdapter(PausableEngine, Protocol):
    """What :class:`relayrl.weight_sync.Controller` drives: an engine whose weights it writes in place.

    Bits are flat ``uint8`` numpy arrays of the tensor's exact memory (see
    :mod:`relayrl.weight_sync.bits`). ``pause`` and ``resume`` bracket every apply; everything else
    the controller does (fetch, decode, verify) happens while the engine serves. An apply is
    ``pause`` → ``apply_tensors`` or ``apply_xor`` → ``set_served_version`` → optional
    ``reset_caches`` → ``resume``.
    """

    def tensor_specs(self) -> dict[str, tuple[str, list[int]]]:
        """Name -> (dtype name, shape) of every tensor the engine serves with."""

    def read_bits(self, name: str) -> np.ndarray:
        """The current bits of tensor ``name`` (a zero-copy view where possible). Must not be written."""

    def apply_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Overwrite each named tensor in place with the given bits (called while paused)."""

    def apply_xor(self, deltas: Mapping[str, np.ndarray]) -> None:
        """XOR the given bits into each named tensor in place (called while paused)."""

    def set_served_version(self, version: int | None) -> None:
        """Record the version now served (called while paused, after a verified apply; None after a failed one)."""


@runtime_checkable
class WeightLoader(PausableEngine, Protocol):
    """An engine that takes weights only by loading named tensors (see :class:`ShadowAdapter`)."""

    def load_weights(self, tensors: Mapping[str, Any], version: int) -> None:
        """Load ``tensors`` (checkpoint name -> torch tensor, a subset of the checkpoint) into the served
        weights while paused, the way the engine's checkpoint loader would, and serve ``version`` from
        now on (caches keyed by weights are invalidated)."""


def _memory_of(tensor: Any) -> tuple[int, int]:
    """(address, bytes) of a torch tensor's or numpy array's elements: equal for aliases of one memory."""
    if isinstance(tensor, np.ndarray):
        return tensor.__array_interface__["data"][0], tensor.nbytes
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class StateDictAdapter:
    """An :class:`EngineAdapter` over a ``torch.nn.Module``, a torch state dict or numpy arrays.

    Pausing takes :attr:`serving_lock`; an inference loop that holds the same lock around each
    forward pass never runs on half-applied weights::

        adapter = StateDictAdapter(model)
        with adapter.serving_lock:
            logits = model(tokens)

    Tensors on an accelerator are supported: their bits are copied to CPU to be read, and written
    back with ``copy_``. CPU copies run on ``threads`` threads (0: every CPU).
    """

    def __init__(self, model_or_state: Any, *, version: int | None = None, threads: int = 0) -> None:
        state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
        if not isinstance(state, Mapping) or not state:
            raise WeightSyncError("StateDictAdapter needs a module with a state_dict or a non-empty mapping of tensors")
        self.tensors: dict[str, Any] = dict(state)
        self.serving_lock = threading.RLock()
        self.version = version
        self.pauses = 0
        self.cache_resets = 0
        self._read_copies: dict[str, np.ndarray] = {}
        self._paused = False
        # Copies during the pause run on every core: applying 2 GiB on one core took ~0.45 s here.
        self._pool = ChunkPool(threads)

    def tensor_specs(self) -> dict[str, tuple[str, list[int]]]:
        return {name: (tensor_bits.dtype_name(value), [int(size) for size in value.shape])
                for name, value in self.tensors.items()}

    def read_bits(self, name: str) -> np.ndarray:
        value = self._tensor(name)
        try:
            return tensor_bits.bits_view(value, name=name)
        except WeightSyncError:  # on an accelerator: copy into a reused CPU buffer
            buffer = self._read_copies.get(name)
            if buffer is None or buffer.size != tensor_bits.nbytes(value):
                buffer = self._read_copies[name] = np.empty(tensor_bits.nbytes(value), np.uint8)
            tensor_bits.copy_bits_into(value, buffer)
            return buffer

    @property
    def served_version(self) -> int | None:
        return self.version

    def pause(self) -> None:
        if self._paused:
            raise WeightSyncError("engine is already paused")
        self.serving_lock.acquire()
        self._paused = True
        self.pauses += 1

    def apply_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        self._require_paused()
        for name, new_bits in tensors.items():
            tensor_bits.write_bits(self._tensor(name), new_bits, name=name, pool=self._pool)

    def apply_xor(self, deltas: Mapping[str, np.ndarray]) -> None:
        self._require_paused()
        applied: set[tuple[int, int]] = set()
        for name, delta in deltas.items():
            tensor = self._tensor(name)
            # Tied weights (an embedding shared with the LM head) are two names for one memory: their
            # deltas are equal, and XORing the memory twice would restore the old bits.
            memory = _memory_of(tensor)
            if memory in applied:
                continue
            applied.add(memory)
            tensor_bits.xor_bits_into(tensor, delta, name=name, pool=self._pool)

    def reset_caches(self) -> None:
        self.cache_resets += 1  # a bare module keeps no caches; counted so callers can check the call

    def set_served_version(self, version: int | None) -> None:
        self.version = version

    def resume(self) -> None:
        self._require_paused()
        self._paused = False
        self.serving_lock.release()

    def _tensor(self, name: str) -> Any:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightSyncError(f"engine has no tensor {name!r}") from None

    def _require_paused(self) -> None:
        if not self._paused:
            raise WeightSyncError("weights may only change while the engine is paused")


class ShadowAdapter(StateDictAdapter):
    """An :class:`EngineAdapter` for a :class:`WeightLoader`, through a CPU shadow of its weights.

    ``shadow`` maps the trainer's tensor names to CPU tensors holding exactly the weights the
    engine serves now (typically loaded from the same model directory). Updates land in the shadow
    first (decoded, XORed and checksum-verified there, while the engine serves); when the controller
    records the new version, the tensors that changed are handed to ``engine.load_weights(changed,
    version)`` while it is paused. Cost: one CPU copy of the weights per engine.
    """

    def __init__(self, engine: WeightLoader, shadow: Mapping[str, Any], *, push: str = "changed",
                 threads: int = 0) -> None:
        if push not in ("changed", "all"):
            raise ValueError(f"push must be 'changed' or 'all', got {push!r}")
        super().__init__(dict(shadow), version=engine.served_version, threads=threads)
        self.engine = engine
        self.push = push
        """``changed``: push only tensors whose bits changed; ``all``: every tensor on every update (for
        engines whose loaders repack groups of tensors together and cannot take a partial set)."""
        self.pushes = 0
        self._changed: set[str] = set()
        self._push_all = False

    # The engine's own pause keeps it from serving; the shadow is only read and written by this
    # adapter, so no serving lock is taken (pause and resume may then run on different threads).
    def pause(self) -> None:
        if self._paused:
            raise WeightSyncError("engine is already paused")
        self.engine.pause()
        self._paused = True
        self.pauses += 1

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
        self.engine.load_weights({name: self.tensors[name] for name in names}, version)
        self._changed.clear()
        self._push_all = False
        self.pushes += 1

    def reset_caches(self) -> None:
        self.engine.reset_caches()
        self.cache_resets += 1

    def resume(self) -> None:
        self._require_paused()
        self._paused = False
        self.engine.resume()
