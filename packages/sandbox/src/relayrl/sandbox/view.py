"""What a sandbox sees of the host: an allowlist, not the host minus a deny-list.

A sandbox's file system is built from nothing: the system directories (:data:`SYSTEM_PATHS`:
programs, libraries, ``/etc``), read-only; the host paths exposed to it (``[sandbox]
expose_paths``, and what an environment adds with :meth:`SandboxBackend.expose`, e.g. the
interpreter its graders run), read-only; its own workspace, writable; private ``/tmp``,
``/var/tmp`` and ``/dev/shm``; ``/dev`` and its own ``/proc``. Nothing else of the host exists in
it: not other tasks' data, not a project checkout, not home directories or caches, whatever the
host's layout. Masks (a task's hidden tests, the host's unix sockets) still apply inside what is
visible.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["SYSTEM_PATHS", "interpreter_paths", "normalized", "visible_paths", "within"]

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""Host paths every sandbox sees read-only (those that exist): the programs and libraries its commands
run and the system configuration they read. ``/bin`` and friends are often symlinks into ``/usr``;
a sandbox gets the same symlinks."""

_INTERPRETER_PREFIXES = ("import json, os, sys; print(json.dumps([os.path.realpath(sys.executable), sys.prefix, "
                         "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))")


def within(path: str, directories: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``directories`` or lies below one."""
    return any(path == directory or path.startswith(directory.rstrip("/") + "/") for directory in directories)


def normalized(path: str | Path) -> list[str]:
    """The absolute path(s) to expose for ``path``: its parent resolved (a sandbox has no symlinked
    directories of its own), and, when ``path`` is itself a symlink, its target too."""
    absolute = os.path.abspath(path)
    parent, name = os.path.split(absolute)
    resolved = os.path.join(os.path.realpath(parent), name) if name else os.path.realpath(absolute)
    paths = [resolved]
    if os.path.islink(resolved):
        paths.append(os.path.realpath(resolved))
    return paths


def visible_paths(exposed: Iterable[str | Path]) -> list[str]:
    """The host paths a sandbox sees read-only: :data:`SYSTEM_PATHS` and ``exposed`` that exist,
    parents first, none below another (it is visible already)."""
    candidates = [*SYSTEM_PATHS, *(path for item in exposed for path in normalized(item))]
    kept: list[str] = []
    for path in sorted(dict.fromkeys(candidates), key=lambda item: (item.count("/"), item)):
        if path == "/" or not os.path.lexists(path):
            continue
        if within(path, [directory for directory in kept if not os.path.islink(directory)]):
            continue
        kept.append(path)
    return kept


def interpreter_paths(python: str) -> list[str]:
    """What a sandbox must see to run interpreter ``python`` (a path, or a name on the sandbox's PATH):
    its real executable and its prefixes (a virtual environment and the installation it was made
    from). Empty when it cannot be asked (then the sandbox sees only the system, and a probe inside
    it says what is missing)."""
    from relayrl.sandbox.local import BASE_ENV

    try:
        # Not -S: a virtual environment's prefix is set by the site module.
        result = subprocess.run([python, "-I", "-c", _INTERPRETER_PREFIXES], capture_output=True, text=True,
                                timeout=60, env={"PATH": BASE_ENV["PATH"]})
        found = json.loads(result.stdout) if result.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    if not (isinstance(found, list) and found and all(isinstance(path, str) for path in found)):
        return []
    executable, *prefixes = found
    return sorted({os.path.dirname(executable), *prefixes})
