"""What the launcher's supervision reads: restart windows, signs of life, why a process died, room
on disk. Small pure helpers, so that :mod:`relayrl.cli.run.launcher` keeps the decisions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["DISK_FULL", "DISK_FULL_WAIT_S", "KNOWN_CAUSES", "LIVENESS_CHECK_S", "MIN_FREE_BYTES", "death_cause",
           "engine_answers", "free_bytes", "known_cause", "mtime", "newest_checkpoint_bytes", "recent_restarts"]


LIVENESS_CHECK_S = 2.0
"""How often the launcher looks for signs of life (at most; a quarter of the timeout when shorter)."""


def mtime(path: Path) -> float | None:
    """``path``'s modification time, or None when it cannot be read."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def engine_answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether the engine server at ``url`` answers ``GET /health`` within ``timeout_s``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as response:
            return bool(200 <= response.status < 300)
    except Exception:  # refused, timed out, a bad answer: no sign of life
        return False


def recent_restarts(child: Any, window_s: float, now: float) -> list[float]:
    """When ``child``'s role was restarted (monotonic seconds) within the last ``window_s`` (all of its
    restarts when ``window_s`` is 0): what ``[rollout] max_restarts`` counts."""
    times = list(getattr(child, "restart_times", []))
    return times if window_s <= 0 else [moment for moment in times if now - moment < window_s]


DISK_FULL = "the disk is full"
DISK_FULL_WAIT_S = 600.0
"""How long the launcher waits for space before restarting a process that died of a full disk."""
MIN_FREE_BYTES = 64 << 20
"""Free space (beyond the newest checkpoint's size) that counts as room again."""


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def newest_checkpoint_bytes(run_dir: Path) -> int:
    """The size of the newest checkpoint's files in ``run_dir`` (what the next save needs again)."""
    steps = sorted(run_dir.glob("checkpoints/step-*"))
    if not steps:
        return 0
    return sum(path.stat().st_size for path in steps[-1].iterdir() if path.is_file())


KNOWN_CAUSES = {"No space left on device": DISK_FULL, "Disk quota exceeded": "the disk quota is exceeded",
                "Cannot allocate memory": "out of memory", "Too many open files": "out of file descriptors"}
"""Errors in a dead process's last log lines that say why it died, as the restart event says them."""


def known_cause(tail: list[str]) -> str | None:
    """Why a process died, when its last log lines say it in a way :data:`KNOWN_CAUSES` knows."""
    for line in reversed(tail):
        for text, cause in KNOWN_CAUSES.items():
            if text in line:
                return f"{cause} ({line.strip()[-160:]})"
    return None


def death_cause(status: int | None, tail: list[str]) -> str | None:
    """Why a process that exited with ``status`` died, from the last lines of its log: only for an
    exit of its own (status > 0; a signal's victim died of the signal), and only from its last two
    lines (the error it died of, not an earlier warning)."""
    return known_cause(tail[-2:]) if status is not None and status > 0 else None
