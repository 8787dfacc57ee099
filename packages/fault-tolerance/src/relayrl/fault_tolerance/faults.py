"""Fault injection for tests and chaos runs: kill a process at a named point, damage checkpoint files.

``RELAYRL_FAULT_KILL=point:step`` (or several, comma-separated) makes :func:`maybe_kill` SIGKILL the
current process when code reaches ``point`` at ``step``, e.g. ``mid-step:3`` or ``mid-write:5``.
Nothing happens when the variable is unset, so the calls can stay in production code paths.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

__all__ = ["corrupt_file", "delete_node_dir", "maybe_kill", "truncate_file"]

ENV = "RELAYRL_FAULT_KILL"


def maybe_kill(point: str, step: int) -> None:
    """SIGKILL this process if ``RELAYRL_FAULT_KILL`` names ``point:step``."""
    wanted = {item.strip() for item in os.environ.get(ENV, "").split(",") if item.strip()}
    if f"{point}:{step}" in wanted:
        os.kill(os.getpid(), signal.SIGKILL)


def corrupt_file(path: str | os.PathLike[str], offset: int = 0) -> None:
    """Flip one bit at ``offset`` (negative: from the end)."""
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        position = offset % size
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x01]))


def truncate_file(path: str | os.PathLike[str], keep_fraction: float = 0.5) -> None:
    """Cut the file to ``keep_fraction`` of its size."""
    size = os.path.getsize(path)
    os.truncate(path, int(size * keep_fraction))


def delete_node_dir(path: str | os.PathLike[str]) -> None:
    """Remove a node's whole directory, as a lost disk would."""
    shutil.rmtree(Path(path), ignore_errors=True)
