"""The engine side of an update: the small protocol a controller drives, and an adapter for state dicts.

A controller needs an engine to: name its tensors and read their current bits (the base a delta is
applied onto), pause, take new bits (copied in place, or XORed in place), optionally drop its
prefix/KV caches, record the version it serves, and resume. :class:`StateDictAdapter` implements it
for a ``torch.nn.Module``, a torch state dict, or a dict of numpy arrays; engines such as vLLM get
their own adapter (the relayrl-vllm plugin).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from relayrl.weight_sync import bits as tensor_bits
from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool


@runtime_checkable
class EngineAdapter(Protocol):
    """What :class:`relayrl.weight_sync.Controller` needs from an inference engine.

    Bits are flat ``uint8`` numpy arrays of the tensor's exact memory (see
    :mod:`relayrl.weight_sync.bits`). ``pause`` and ``resume`` bracket every apply; everything else
    the controller does (fetch, decode, verify) happens while the engine serves.
    """

    def tensor_specs(self) -> dict[str, tuple[str, list[int]]]:
        """Name -> (dtype name, shape) of every tensor the engine serves with."""

    def read_bits(self, name: str) -> np.ndarray:
        """The current bits of tensor ``name`` (a zero-copy view where possible). Must not be written."""

    def served_version(self) -> int | None:
        """The weight version the engine serves now; None when unknown (fresh, or after a failed apply)."""

    def pause(self) -> None:
        """Stop starting new forward passes; return once none is running."""

    def apply_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Overwrite each named tensor in place with the given bits (called while paused)."""

    def apply_xor(self, deltas: Mapping[str, np.ndarray]) -> None:
        """XOR the given bits into each named tensor in place (called while paused)."""

    def reset_caches(self) -> None:
        """Drop prefix/KV caches computed with the old weights (called while paused, if configured)."""

    def set_served_version(self, version: int | None) -> None:
        """Record the version now served (called while paused, after a verified apply)."""

    def resume(self) -> None:
        """Start serving again."""


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
