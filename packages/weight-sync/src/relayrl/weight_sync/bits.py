"""Tensors as raw bits: zero-copy byte views of numpy arrays and torch tensors, dtypes by name.

Weight sync never interprets values: a delta is the XOR of bit patterns and a checksum covers
bits. So every tensor is handled as a flat, contiguous ``uint8`` numpy view of its memory plus a
dtype *name* and an element width. numpy has no bfloat16 or fp8, but torch tensors of those types
are viewed through ``tensor.view(torch.uint8)``, which shares memory; nothing is converted.

torch is optional: it is imported only when a torch tensor is passed in.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from relayrl.weight_sync.errors import WeightSyncError
from relayrl.weight_sync.parallel import ChunkPool, parallel_copy, parallel_xor

_TORCH_DTYPE_NAMES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
    "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "complex64": 8, "complex128": 16,
}

if sys.byteorder != "little":  # pragma: no cover - no big-endian machine to test on
    raise ImportError("relayrl-weight-sync stores raw little-endian bits; big-endian hosts are not supported")


def is_torch_tensor(value: Any) -> bool:
    """True for a ``torch.Tensor`` (checked without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def dtype_name(value: Any) -> str:
    """The dtype of a numpy array or torch tensor as a plain name (``bfloat16``, ``float32`` ...)."""
    if is_torch_tensor(value):
        return str(value.dtype).removeprefix("torch.")
    return np.dtype(value.dtype).name


CASTABLE_DTYPES = ("float32", "bfloat16", "float16")
"""What :func:`cast_floating` converts to: the engine representations weight sync publishes in."""


def cast_floating(value: Any, dtype: str) -> Any:
    """``value`` in floating dtype ``dtype`` (round to nearest even, the way every engine casts on
    load); integer and boolean tensors, and tensors already in ``dtype``, are returned as they are."""
    if dtype not in CASTABLE_DTYPES:
        raise WeightSyncError(f"cannot publish in {dtype!r}: one of {', '.join(CASTABLE_DTYPES)}")
    if dtype_name(value) == dtype or not dtype_name(value).startswith(("float", "bfloat")):
        return value
    import torch  # bfloat16 has no numpy dtype: casting goes through torch

    tensor = value if is_torch_tensor(value) else torch.from_numpy(np.ascontiguousarray(value))
    return tensor.detach().to(getattr(torch, dtype))


def element_bytes(dtype: str) -> int:
    """Bytes per element of dtype name ``dtype``."""
    if dtype in _TORCH_DTYPE_NAMES:
        return _TORCH_DTYPE_NAMES[dtype]
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        raise WeightSyncError(f"unknown dtype {dtype!r}") from None


def nbytes(value: Any) -> int:
    """Size in bytes of the tensor's data."""
    if is_torch_tensor(value):
        return value.numel() * value.element_size()
    return int(value.nbytes)


def bits_view(value: Any, *, name: str = "tensor") -> np.ndarray:
    """A flat, writable ``uint8`` numpy view sharing memory with ``value`` (CPU, contiguous).

    Raises :class:`WeightSyncError` naming ``name`` for a tensor that cannot be viewed without a
    copy (on an accelerator, or not contiguous): callers that accept those copy first
    (:func:`copy_bits_into`).
    """
    if is_torch_tensor(value):
        if value.device.type != "cpu" or not value.is_contiguous():
            raise WeightSyncError(f"{name}: a zero-copy view needs a contiguous CPU tensor "
                                  f"(device {value.device}, contiguous {value.is_contiguous()})")
        flat = value.detach().reshape(-1)
        if flat.numel() == 0:
            return np.empty(0, np.uint8)
        return flat.view(_torch().uint8).numpy()
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        raise WeightSyncError(f"{name}: a zero-copy view needs a C-contiguous array")
    return array.reshape(-1).view(np.uint8)


def copy_bits_into(value: Any, out: np.ndarray, pool: ChunkPool | None = None) -> None:
    """Copy the bits of ``value`` (any device, any layout) into the ``uint8`` buffer ``out``.

    With ``pool``, copies from CPU memory run in slices on its threads.
    """
    if pool is not None:
        try:
            parallel_copy(out, bits_view(value), pool)
            return
        except WeightSyncError:
            pass  # on an accelerator or not contiguous: one copy through torch below
    if is_torch_tensor(value):
        torch = _torch()
        source = value.detach()
        if not source.is_contiguous():
            source = source.contiguous()
        if source.numel():
            torch.from_numpy(out).copy_(source.reshape(-1).view(torch.uint8))
        return
    np.copyto(out, np.ascontiguousarray(value).reshape(-1).view(np.uint8))


def write_bits(value: Any, bits: np.ndarray, *, name: str = "tensor", pool: ChunkPool | None = None) -> None:
    """Overwrite the memory of tensor ``value`` in place with ``bits`` (any device; CPU copies on ``pool``)."""
    if is_torch_tensor(value) and (value.device.type != "cpu" or not value.is_contiguous()):
        torch = _torch()
        if not value.is_contiguous():
            raise WeightSyncError(f"{name}: cannot update a non-contiguous tensor in place")
        value.detach().reshape(-1).view(torch.uint8).copy_(torch.from_numpy(bits))
        return
    if pool is not None:
        parallel_copy(bits_view(value, name=name), bits, pool)
    else:
        np.copyto(bits_view(value, name=name), bits)


def xor_bits_into(value: Any, delta: np.ndarray, *, name: str = "tensor", pool: ChunkPool | None = None) -> None:
    """XOR ``delta`` into the memory of tensor ``value`` in place (any device; CPU work on ``pool``)."""
    if is_torch_tensor(value) and value.device.type != "cpu":
        torch = _torch()
        target = value.detach().reshape(-1).view(torch.uint8)
        target.bitwise_xor_(torch.from_numpy(delta).to(value.device, non_blocking=True))
        return
    view = bits_view(value, name=name)
    if pool is not None:
        parallel_xor(view, delta, pool)
    else:
        np.bitwise_xor(view, delta, out=view)


def _torch() -> Any:
    import torch

    return torch
