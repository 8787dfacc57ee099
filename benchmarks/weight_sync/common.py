"""Shared pieces of the weight-sync benchmarks: the machine line, timing, tables, synthetic models."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relayrl.weight_sync.testing.synthetic import bf16_bits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from results import command_line, commit, write_results

GIB = 1 << 30
MIB = 1 << 20


def machine() -> str:
    """One line describing where the benchmark ran."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    cores = len(os.sched_getaffinity(0))
    return f"{cpu}, {cores} cores available, {memory:.0f} GiB RAM, Python {platform.python_version()}"


def best_of(repeats: int, function: Callable[[], Any]) -> tuple[float, Any]:
    """Smallest wall time of ``repeats`` calls (shared machines are noisy), and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A plain-text table, also valid Markdown."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(header), *(len(row[index]) for row in cells)) for index, header in enumerate(headers)]
    return (["| " + " | ".join(header.ljust(width) for header, width in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (width + 2) for width in widths) + "|"]
            + ["| " + " | ".join(cell.rjust(width) for cell, width in zip(row, widths)) + " |" for row in cells])


class Report:
    """What a benchmark prints, kept: a full run writes it to ``benchmarks/results/weight_sync-<name>.json``,
    which docs/weight-sync.md renders (``python benchmarks/results.py``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.revision = commit()  # the commit the run started on
        self.lines: list[str] = []
        self.data: dict[str, Any] = {}

    def say(self, text: str = "") -> None:
        print(text)
        self.lines.append(text)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        for line in table_lines(headers, rows):
            self.say(line)
        self.data.setdefault("tables", []).append({"headers": list(headers), "rows": [[str(c) for c in row] for row in rows]})

    def save(self, quick: bool) -> None:
        """Write the results file (not for ``--quick`` smoke runs)."""
        if quick:
            return
        path = write_results(f"weight_sync-{self.name}", command=command_line(), markdown="\n".join(self.lines),
                             data=self.data, revision=self.revision)
        print(f"wrote {path}")


def bf16_model(num_params: int, num_tensors: int, seed: int = 0, std: float = 0.02) -> dict[str, np.ndarray]:
    """bf16 weights ~N(0, std) as uint16 bit patterns, split into ``num_tensors`` tensors (generated in pieces)."""
    rng = np.random.default_rng(seed)
    sizes = [num_params // num_tensors] * num_tensors
    sizes[-1] += num_params - sum(sizes)
    model = {}
    for index, size in enumerate(sizes):
        bits = np.empty(size, np.uint16)
        for start in range(0, size, 16 * MIB):
            piece = rng.normal(0.0, std, min(16 * MIB, size - start)).astype(np.float32)
            bf16_bits(piece, out=bits[start:start + piece.size])
        model[f"layers.{index}.weight"] = bits
    return model


def nudge(model: dict[str, np.ndarray], fraction: float, seed: int) -> int:
    """Move ``fraction`` of the values by one bf16 ulp up or down in place (an RL step); returns how many."""
    rng = np.random.default_rng(seed)
    changed = 0
    for bits in model.values():
        where = rng.integers(0, bits.size, int(bits.size * fraction))
        step = np.where(rng.random(where.size) < 0.5, 1, -1).astype(np.int32)
        bits[where] = (bits[where].astype(np.int32) + step).astype(np.uint16)
        changed += where.size
    return changed
