"""The built-in ``local`` launcher: every process of the run on this machine, as a child of ``relayrl run``."""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relayrl.cli.run.launcher import Child

__all__ = ["LocalBackend", "LocalSlot", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalSlot:
    """A place on this machine: servers bind the loopback address."""

    host = "127.0.0.1"

    def __init__(self, python: str) -> None:
        self.python = python

    def free_port(self) -> int:
        return free_port(self.host)

    def start(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str], *,
              capture_stdout: bool = False) -> Child:
        child = Child(name, [self.python, *argv], log_path, env=dict(env))
        child.start(capture_stdout=capture_stdout)
        return child


class LocalBackend:
    """Places every process on this machine (the ``local`` launcher)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    @classmethod
    def create(cls, *, options: Any = None, world: int = 1, run_dir: Path | None = None) -> LocalBackend:
        return cls()

    def place(self, role: str, name: str, *, rank: int | None = None) -> LocalSlot:
        return LocalSlot(self.python)

    def describe(self) -> str:
        return "launcher: local (every process on this machine)"

    def close(self) -> None:
        pass
