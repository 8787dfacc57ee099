"""Deterministic training in one call, and RNG state capture for checkpoints.

``enable_determinism(seed)`` makes a training step bitwise reproducible on the same hardware and
software: it seeds Python, NumPy (when installed) and torch (CPU and CUDA), turns on
``torch.use_deterministic_algorithms`` (an op without a deterministic implementation then raises
instead of silently varying), disables cuDNN autotuning, sets ``CUBLAS_WORKSPACE_CONFIG`` for
deterministic cuBLAS, and optionally fixes the intra-op thread count (CPU reductions split work by
thread, so a different count can change the last bits of a sum).

``rng_state()`` / ``set_rng_state()`` capture and restore every generator, so a run resumed from a
checkpoint continues with the same random stream.
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch

__all__ = ["enable_determinism", "rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (if installed) and torch's global generators."""
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def enable_determinism(seed: int, *, num_threads: int | None = None, warn_only: bool = False) -> None:
    """Make subsequent training bitwise reproducible (see the module docstring)."""
    # Must be set before the first cuBLAS handle is created; harmless on CPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    seed_everything(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state, for a checkpoint."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
