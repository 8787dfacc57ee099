"""Hook specifications owned by the ``relayrl`` command (documented in ``docs/plugins.md``): launchers,
and their contract next to the hook.

A launcher decides *where* the processes of a run execute: the built-in ``local`` one starts them on
this machine; ``relayrl-ray`` places each in a Ray actor on the cluster's nodes. What runs, in which
order, how a death is answered (restart, resume, shrink) and what the run directory records is the
same for every launcher (:class:`relayrl.cli.run.launcher.Launcher`): a backend only places and
starts processes, and reports on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from relayrl.core.plugins import Kind, Registration, hookspec

ROLES = ("trainer", "engine", "mirror", "rollout")
"""The kinds of process a run has: trainer ranks, engine servers, the node mirror, the rollout manager."""


class RoleProcess(Protocol):
    """One started process of a run, wherever it was placed."""

    name: str
    """``trainer``, ``trainer-1``, ``engine-0``, ``mirror``, ``rollout``."""
    log_path: Path
    env: dict[str, str]
    """The variables the launcher set for it (on top of the environment of the place it runs in)."""
    restarts: int

    @property
    def pid(self) -> int | None:
        """Its process id on its node (None once gone)."""

    @property
    def node(self) -> str:
        """Where it runs, for operators (``local``, or the Ray node's address)."""

    def read_ready(self, timeout_s: float, on_wait: Callable[[], None] = ...) -> int:
        """Wait for the ``READY <port>`` line a server prints on standard output; the port."""

    def poll(self) -> int | None:
        """None while it runs; its exit status once it exited (negative: killed by that signal; a
        process whose place vanished, a dead actor or node, reads as killed by SIGKILL)."""

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its process group)."""

    def wait(self, timeout_s: float) -> None:
        """Wait for its exit; kill it (and free its place) after ``timeout_s``."""


class Slot(Protocol):
    """A place reserved for one process: its address is known before the process starts (an engine
    binds it; trainer rank 0's is every rank's rendezvous)."""

    host: str
    """The address other processes reach a server in this slot at."""

    def free_port(self) -> int:
        """A TCP port free on the slot's host right now."""

    def start(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str], *,
              capture_stdout: bool = False) -> RoleProcess:
        """Start ``python argv...`` (``argv`` without the interpreter: the slot's own runs it) with
        ``env`` added to its environment, stdout (unless captured for :meth:`RoleProcess.read_ready`)
        and stderr appended to ``log_path``; the process gets SIGTERM if its supervisor dies."""


class LauncherBackend(Protocol):
    """What a launcher factory returns."""

    def place(self, role: str, name: str, *, rank: int | None = None) -> Slot:
        """Reserve a place for a process of ``role`` (one of :data:`ROLES`). Trainer ranks come with
        ``rank``: a backend gang-schedules them (every rank of the group, or none)."""

    def describe(self) -> str:
        """One line for the start of a run: where its processes go."""

    def close(self) -> None:
        """Release everything placed (after every process was waited for)."""


class LauncherFactory(Protocol):
    def __call__(self, *, options: Any, world: int, run_dir: Path) -> LauncherBackend:
        """``options``: the registration's config struct decoded from ``[launcher] options`` (None
        when it declares none); ``world``: the trainer's ranks, for gang scheduling."""


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
LAUNCHERS: Kind[LauncherFactory] = Kind("relayrl_cli_launchers", "launcher")


@hookspec
def relayrl_cli_launchers() -> Iterable[Registration[LauncherFactory]]:
    """Launchers, selected by ``[launcher] backend`` (or ``relayrl run --launcher NAME``).

    The contract is :class:`LauncherFactory` (and the :class:`LauncherBackend`, :class:`Slot` and
    :class:`RoleProcess` it leads to); a backend passes ``relayrl.cli.testing.LauncherTests``. Built
    in: ``local`` (processes on this machine); ``relayrl-ray`` adds ``ray``.
    """
