"""Per-sandbox cgroups (v1 or v2, whichever the host lets us write) for memory and process limits.

Layout: one cgroup per sandbox carries the limits (``pids.max``, the memory limit), and one child
cgroup per command tracks that command's processes, so that a command's whole tree can be found and
killed when it returns, daemonised children included, without touching concurrent commands of the
same sandbox. The sandbox cgroups are created below the cgroup this process already lives in, so
that the limits of whoever runs relayrl still apply to the sandboxes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

__all__ = ["CgroupError", "CommandCgroup", "SandboxCgroup", "cgroup_support"]

ROOT = Path("/sys/fs/cgroup")
PREFIX = "relayrl-sandbox"


class CgroupError(OSError):
    """A cgroup could not be created or configured."""


def _own_path(controller: str) -> str | None:
    """This process's cgroup path for a v1 ``controller`` (or ``""`` for the v2 unified entry)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
        if controller == "" and controllers == "":
            return path
    return None


def _v1_base(controller: str) -> Path | None:
    own = _own_path(controller)
    mount = ROOT / controller
    if own is None or not (mount / "cgroup.procs").exists():
        return None
    return mount / own.lstrip("/") / PREFIX


def _v2_base() -> Path | None:
    own = _own_path("")
    for mount in (ROOT, ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        if own is not None and controllers.exists():
            enabled = set(controllers.read_text().split())
            if {"memory", "pids"} <= enabled:
                return mount / own.lstrip("/") / PREFIX
    return None


def _writable_dir(base: Path) -> bool:
    """True when a child cgroup can be made (and removed) under ``base``."""
    probe = base / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        base.mkdir(exist_ok=True)
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def cgroup_support() -> tuple[str | None, str]:
    """``("v1" | "v2" | None, reason)``: which cgroup version can enforce memory and pids limits here."""
    memory, pids = _v1_base("memory"), _v1_base("pids")
    if memory is not None and pids is not None and _writable_dir(memory) and _writable_dir(pids):
        return "v1", f"cgroup v1 at {memory.parent} and {pids.parent}"
    v2 = _v2_base()
    if v2 is not None and _writable_dir(v2):
        try:
            (v2 / "cgroup.subtree_control").write_text("+memory +pids")
            return "v2", f"cgroup v2 at {v2.parent}"
        except OSError as exc:
            return None, f"cgroup v2 at {v2.parent}: cannot delegate memory and pids controllers ({exc})"
    return None, "no writable cgroup v1 memory+pids hierarchy or v2 hierarchy with memory and pids controllers"


def _kill_members(directories: list[Path]) -> int:
    """SIGKILL every process listed in ``cgroup.procs`` of the directories, until none are left."""
    killed = 0
    for _ in range(1000):  # a fork bomb may add processes while we kill; pids.max bounds it
        pids = set()
        for directory in directories:
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.001)
    raise CgroupError(f"processes of {directories} survive SIGKILL")


def _remove(directory: Path) -> None:
    for _ in range(200):  # rmdir fails with EBUSY until killed tasks are fully reaped
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)
    raise CgroupError(f"cannot remove cgroup {directory}")


def _oom_kills(directory: Path) -> int:
    """The ``oom_kill`` count of a memory cgroup (v1 ``memory.oom_control``, v2 ``memory.events``)."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            for line in (directory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return 0


class CommandCgroup:
    """The cgroup(s) of one command: join with :attr:`procs_files`; :meth:`kill` and :meth:`remove` after."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories
        for directory in directories:
            directory.mkdir()

    @property
    def procs_files(self) -> list[Path]:
        return [directory / "cgroup.procs" for directory in self.directories]

    def kill(self) -> int:
        return _kill_members(self.directories)

    def oom_kills(self) -> int:
        """OOM kills of this command's processes. On cgroup v1 they are counted only here, in the
        cgroup of the killed process, not in the sandbox's cgroup whose limit was hit."""
        return _oom_kills(self.directories[0])

    def remove(self) -> None:
        self.kill()
        for directory in self.directories:
            _remove(directory)


class SandboxCgroup:
    """The limits of one sandbox. ``version`` is ``"v1"`` or ``"v2"``."""

    def __init__(self, version: str, name: str, *, memory_bytes: int, max_processes: int) -> None:
        self.version = version
        if version == "v1":
            memory, pids = _v1_base("memory"), _v1_base("pids")
            assert memory is not None and pids is not None
            self.directories = [memory / name, pids / name]
        else:
            base = _v2_base()
            assert base is not None
            self.directories = [base / name]
        for directory in self.directories:
            directory.parent.mkdir(exist_ok=True)
            directory.mkdir()
        try:
            if version == "v1":
                memory_dir, pids_dir = self.directories
                (memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (memory_dir / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (pids_dir / "pids.max").write_text(str(max_processes))
            else:
                (self.directories[0] / "cgroup.subtree_control").write_text("+memory +pids")
                (self.directories[0] / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (self.directories[0] / "memory.swap.max").write_text("0")
                (self.directories[0] / "pids.max").write_text(str(max_processes))
        except OSError as exc:
            self.remove()
            raise CgroupError(f"cannot set limits on {self.directories}: {exc}") from exc
        self._commands = 0

    @classmethod
    def adopt(cls, directories: list[Path]) -> SandboxCgroup:
        """The existing cgroup directories of a sandbox whose owner died (to :meth:`remove` them)."""
        cgroup = cls.__new__(cls)
        cgroup.version, cgroup.directories, cgroup._commands = "", list(directories), 0
        return cgroup

    def command(self) -> CommandCgroup:
        """A fresh child cgroup for one command (inherits the sandbox's limits)."""
        self._commands += 1
        name = f"cmd-{self._commands}-{uuid.uuid4().hex[:6]}"
        return CommandCgroup([directory / name for directory in self.directories])

    def peak_memory(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        try:
            return int((self.directories[0] / name).read_text())
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        return _oom_kills(self.directories[0])

    def remove(self) -> None:
        """Kill anything left in the sandbox's cgroups and remove them (children first)."""
        for directory in self.directories:
            if not directory.exists():
                continue
            children = [child for child in directory.iterdir() if child.is_dir()]
            _kill_members([*children, directory])
            for child in children:
                _remove(child)
            _remove(directory)
