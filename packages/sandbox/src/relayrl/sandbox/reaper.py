"""Reaping the sandboxes of owners that died without closing them (SIGKILL, OOM kill, power loss).

A sandbox on this host holds a directory under the backend's root, a workspace tmpfs mounted in it,
a claimed uid, cgroups and (as root) a namespace holder process; :meth:`LocalSandbox.close` undoes
all of that, but a process killed by SIGKILL never calls it, and a crash-looping rollout process
piles them up. Each sandbox therefore records its owner (:data:`OWNER_FILE`: the owner's process
identity and what must be undone) in its directory; :func:`reap_stale` removes every sandbox whose
owner is provably dead (:func:`relayrl.core.processes.is_dead`), and nothing else. Backends call it
when their first sandbox is created and then at most every :data:`REAP_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from relayrl.core.processes import identity, is_dead, start_time
from relayrl.sandbox.cgroups import SandboxCgroup

__all__ = ["OWNER_FILE", "REAP_INTERVAL_S", "maybe_reap", "reap_stale", "write_owner"]

OWNER_FILE = "owner.json"
REAP_INTERVAL_S = 300.0
UNCLAIMED_GRACE_S = 3600.0
"""A sandbox directory without an owner record (its creator died between ``mkdir`` and writing the
record, or an older relayrl made it) is reaped once it is this old."""

_last_reap: dict[str, float] = {}
_reap_lock = threading.Lock()


def write_owner(directory: Path, **resources: Any) -> None:
    """Record (atomically) that this process owns the sandbox in ``directory`` and what it holds."""
    record = {**identity(), **resources}
    partial = directory / f".{OWNER_FILE}.partial"
    partial.write_text(json.dumps(record))
    os.chmod(partial, 0o600)
    partial.replace(directory / OWNER_FILE)


def maybe_reap(root: Path) -> list[str]:
    """:func:`reap_stale` on ``root`` if this process has not done so in the last ``REAP_INTERVAL_S``."""
    key = str(root)
    with _reap_lock:
        now = time.monotonic()
        if key in _last_reap and now - _last_reap[key] < REAP_INTERVAL_S:
            return []
        _last_reap[key] = now
    try:
        return reap_stale(root)
    except OSError:  # housekeeping: never fail a sandbox's creation over it
        return []


def reap_stale(root: Path) -> list[str]:
    """Remove every sandbox under ``root`` whose owner is provably dead; the ids removed."""
    if not root.is_dir():
        return []
    reaped = []
    for directory in sorted(root.iterdir()):
        if directory.name.startswith(".") or not directory.is_dir():
            continue
        record = _read_owner(directory)
        if record is None:
            with contextlib.suppress(OSError):
                if time.time() - directory.stat().st_mtime > UNCLAIMED_GRACE_S:
                    _undo(directory, {})
                    reaped.append(directory.name)
            continue
        if is_dead(record):
            _undo(directory, record)
            reaped.append(directory.name)
    _drop_orphaned_uid_claims(root)
    return reaped


def _read_owner(directory: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _undo(directory: Path, record: dict[str, Any]) -> None:
    """What :meth:`LocalSandbox.close` would have done, from the record alone."""
    holder = record.get("holder_pid")
    if isinstance(holder, int) and holder > 0 and start_time(holder) == record.get("holder_start"):
        with contextlib.suppress(OSError):
            os.kill(holder, signal.SIGKILL)  # the namespaces go with their last process
    cgroup = record.get("cgroup")
    if isinstance(cgroup, list) and cgroup:
        with contextlib.suppress(OSError):
            SandboxCgroup.adopt([Path(path) for path in cgroup]).remove()  # kills what still runs in it
    workspace = directory / "workspace"
    if os.path.ismount(workspace):
        result = subprocess.run(["umount", str(workspace)], capture_output=True)
        if result.returncode != 0:
            subprocess.run(["umount", "--lazy", str(workspace)], capture_output=True)
    shutil.rmtree(directory, ignore_errors=True)
    uid = record.get("uid")
    if isinstance(uid, int):
        with contextlib.suppress(FileNotFoundError):
            (directory.parent / ".uids" / str(uid)).unlink()


def _drop_orphaned_uid_claims(root: Path) -> None:
    """Uid claims that name a sandbox which no longer exists (its owner died mid-close, or it was reaped)."""
    claims = root / ".uids"
    if not claims.is_dir():
        return
    for claim in claims.iterdir():
        with contextlib.suppress(OSError):
            owner = claim.read_text().strip()
            if owner and not (root / owner).exists() and time.time() - claim.stat().st_mtime > 60:
                claim.unlink()
