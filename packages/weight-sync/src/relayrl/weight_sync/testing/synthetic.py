"""Synthetic models for tests and benchmarks, numpy only (bfloat16 kept as its uint16 bit pattern).

``bf16_bits`` rounds float32 to bfloat16 exactly as torch does (round to nearest, ties to even), so
an fp32 master copy updated by :func:`adam_like_step` and re-rounded reproduces the trainer's
situation: a small learning rate changes only a few bf16 values per step.
"""

from __future__ import annotations

import numpy as np


def bf16_bits(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 ``values``, round-to-nearest-even."""
    words = values.astype(np.float32, copy=False).view(np.uint32)
    rounding = ((words >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((words + rounding) >> 16).astype(np.uint16)
    if out is None:
        return rounded
    np.copyto(out, rounded)
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def init_master(num_params: int, seed: int = 0, std: float = 0.02) -> np.ndarray:
    """fp32 master weights ~ N(0, std)."""
    return np.random.default_rng(seed).normal(0.0, std, num_params).astype(np.float32)


def adam_like_step(master: np.ndarray, lr: float, rng: np.random.Generator) -> None:
    """One Adam-like update in place: every weight moves by about ``lr`` (Adam normalises the step).

    The step of each weight is ``lr * u`` with ``u`` a unit-scale update of random sign whose
    magnitude varies between weights (Adam's m / sqrt(v) for noisy gradients).
    """
    update = rng.standard_normal(master.size, dtype=np.float32)
    np.clip(update, -3.0, 3.0, out=update)
    master -= np.float32(lr) * update


def model_state(version: int, seed: int, sizes: dict[str, int], changed_fraction: float = 0.02) -> dict[str, np.ndarray]:
    """Deterministic bf16-like (uint16) tensors of ``version``: computable without the versions before it.

    Version 0 is random; version v differs from version 0 at about ``changed_fraction`` of the
    positions (which ones depends on v), so consecutive versions differ at a few percent.
    """
    state = {}
    for index, (name, size) in enumerate(sizes.items()):
        base = np.random.default_rng([seed, index]).integers(0, 1 << 16, size, dtype=np.uint16)
        if version:
            rng = np.random.default_rng([seed, index, version])
            where = rng.integers(0, size, max(1, int(size * changed_fraction)))
            base[where] ^= rng.integers(1, 4, where.size, dtype=np.uint16)
        state[name] = base
    return state
