"""Naming a process so that another process can later tell, without doubt, whether it still runs.

A pid alone is not enough: pids are reused, and after a reboot they mean nothing. An identity is
(host, boot id, pid, start time); a process is provably dead when it was on this host and either
the boot changed, the pid is gone, or the pid now belongs to a process that started at another time.
Used by the run lease (one launcher per run) and by the sandbox reaper (sandboxes of dead owners).
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["boot_id", "identity", "is_dead", "start_time"]


def boot_id() -> str:
    """This boot's id ('' where the kernel does not say, e.g. not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot ('' when it is gone or unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[19]  # field 22 of proc_pid_stat(5), counted after the command name
    except (OSError, IndexError):
        return ""


def identity(pid: int | None = None) -> dict[str, Any]:
    """The identity of ``pid`` (default: this process), as JSON-ready fields."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pid": pid, "pid_start": start_time(pid)}


def is_dead(record: dict[str, Any]) -> bool | None:
    """Whether the process an :func:`identity` names is provably dead; None when this host cannot tell
    (a process of another host, or a kernel without boot ids)."""
    if record.get("host") != socket.gethostname():
        return None
    recorded, current = record.get("boot_id"), boot_id()
    if not recorded or not current:
        return None
    if recorded != current:  # this host rebooted since
        return True
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        pass
    started = start_time(pid)
    return not started or started != record.get("pid_start") or _state(pid) == "Z"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
