"""Timing helper shared by the benchmark scripts (run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_time(function: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The fastest of ``repeats`` calls of ``function`` (seconds) and the last call's result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result
