"""A small model and engines for tests: versions whose bits are known without replaying anything."""

from __future__ import annotations

import numpy as np

from relayrl.weight_sync.engine import StateDictAdapter
from relayrl.weight_sync.testing.synthetic import model_state

SMALL_SIZES = {"embed": 50_000, "mlp": 300_000, "norm": 5}
"""Tensor name -> element count (uint16, i.e. bf16 bit patterns) of the small test model."""


def small_state(version: int, seed: int = 7) -> dict[str, np.ndarray]:
    """The tensors of ``version`` of the small model."""
    return model_state(version, seed, SMALL_SIZES)


def zero_engine() -> StateDictAdapter:
    """An engine with the small model's tensors, all zero, serving no version."""
    return StateDictAdapter({name: np.zeros(size, np.uint16) for name, size in SMALL_SIZES.items()})


def engine_equals(engine: StateDictAdapter, expected: dict[str, np.ndarray]) -> bool:
    """True when every tensor of ``engine`` holds exactly the bits in ``expected``."""
    return all(np.array_equal(engine.tensors[name], value) for name, value in expected.items())
