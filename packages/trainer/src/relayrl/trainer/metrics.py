"""Step metrics to ``metrics.jsonl`` in the run directory, and to TensorBoard when it is installed.

One JSON object per line: ``{"step": N, "time": unix_seconds, "metrics": {name: value}}``. Lines are
appended and flushed per step, so a crashed run keeps every completed step and a reader (``relayrl
report``, a live display) can tail the file. A resumed run appends; :func:`read_metrics` keeps the
last record of each step, so steps replayed after a crash are not counted twice.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "read_metrics"]


class MetricsWriter:
    """Appends step metrics to ``<run_dir>/metrics.jsonl`` (and TensorBoard under ``<run_dir>/tensorboard``)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as handle:
                handle.seek(-1, os.SEEK_END)
                torn = handle.read(1) != b"\n"
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the writer; line-buffered
        if torn:  # a crash cut the last line short: start ours on a fresh line
            self._file.write("\n")
        self._tensorboard = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except Exception:  # tensorboard not installed: jsonl only
                self._tensorboard = None

    @property
    def tensorboard_enabled(self) -> bool:
        return self._tensorboard is not None

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {name: _finite(value) for name, value in sorted(metrics.items())}
        self._file.write(json.dumps({"step": step, "time": time.time(), "metrics": clean}) + "\n")
        if self._tensorboard is not None:
            for name, value in clean.items():
                if value is not None:
                    self._tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every step's record, in step order, the last write of a step winning; a torn last line is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    records: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return []
    with open(path) as handle:
        for line in handle:
            record = parse_metrics_line(line)
            if record is not None:
                records[record["step"]] = record
    return [records[step] for step in sorted(records)]


def parse_metrics_line(line: str) -> dict[str, Any] | None:
    """One line of ``metrics.jsonl`` as ``{"step": int, "time": float, "metrics": {name: number}}``; None
    for a line cut short by a crash or of another shape (every reader skips it, none may crash on it:
    the launcher's display reads this file). Values that are not numbers are dropped."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
        return None
    step, when = record.get("step"), record.get("time", 0.0)
    if isinstance(step, bool) or not isinstance(step, int) or isinstance(when, bool) or not isinstance(when, (int, float)):
        return None
    record["time"] = float(when)
    # A value that is not a number (or None) is dropped; the step's other metrics stay.
    record["metrics"] = {name: value for name, value in record["metrics"].items()
                         if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))}
    return record
