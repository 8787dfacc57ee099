"""Which Python the grading sandbox runs: one that imports the host's reasoning_gym release.

The scorer regenerates each task from its seed inside the sandbox, so the sandbox's reasoning_gym
must be the release the host generated the tasks with (a different release may make different
tasks from the same seed). Sandboxes run commands as a user of their own, who often cannot run
the host's interpreter (a virtual environment under ``/root``), so ``python = "auto"`` tries, in
order, and keeps the first that imports the same release in a sandbox:

1. the host's own interpreter (``sys.executable``): a user's virtual environment, not root;
2. the sandbox's ``python3`` (the distribution's, with reasoning-gym installed for it);
3. a grader environment relayrl builds once: a virtual environment of the distribution's
   ``/usr/bin/python3`` with that reasoning-gym release from the package index, readable by every
   user, under ``$RELAYRL_GRADER_HOME`` (default ``/var/cache/relayrl`` as root, else
   ``~/.cache/relayrl``; not under ``/tmp`` or ``/var/tmp``, which are private in a sandbox).

When none works the error says, in one line, what to set. A named ``python`` is checked the same way.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from relayrl.core.errors import RelayrlError

__all__ = ["GraderPythonError", "grader_home", "host_release", "probe", "resolve_python"]

logger = logging.getLogger(__name__)

# The distribution's version: reasoning_gym.__version__ lags its releases (0.1.25 says 0.1.19).
_PROBE = ("import json, importlib.metadata, reasoning_gym; "
          "print(json.dumps(importlib.metadata.version('reasoning-gym')))")


class GraderPythonError(RelayrlError):
    """No interpreter the sandbox can run imports the host's reasoning_gym release."""


def host_release() -> str:
    """The reasoning-gym release installed on the host (its distribution's version)."""
    import importlib.metadata

    return importlib.metadata.version("reasoning-gym")


def grader_home() -> Path:
    """Where relayrl builds grader environments (see the module docstring)."""
    configured = os.environ.get("RELAYRL_GRADER_HOME")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/relayrl")
    return Path.home() / ".cache" / "relayrl"


def probe(backend: Any, python: str) -> tuple[str | None, str]:
    """(release, "") when ``python`` imports reasoning_gym in a sandbox of ``backend``, else (None, why)."""
    from relayrl.sandbox.view import interpreter_paths

    backend.expose(interpreter_paths(python))  # a sandbox sees the system directories and what is exposed
    try:
        with backend.create() as sandbox:
            result = sandbox.exec([python, "-I", "-c", _PROBE], timeout=120)
    except Exception as exc:  # a missing binary is an exec error on some backends
        return None, f"{type(exc).__name__}: {exc}"
    if not result.ok:
        lines = result.output.strip().splitlines()
        return None, lines[-1] if lines else f"exit {result.exit_status}"
    try:
        return str(json.loads(result.stdout.strip().splitlines()[-1])), ""
    except (ValueError, IndexError):
        return None, f"unexpected output {result.stdout[-200:]!r}"


def _build(release: str) -> Path:
    """A world-readable virtual environment of /usr/bin/python3 with reasoning-gym ``release``."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        raise GraderPythonError("no /usr/bin/python3 to build a grader environment from")
    home = grader_home()
    target = home / f"reasoning-gym-{release}"
    python = target / "bin" / "python3"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".reasoning-gym.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes of one run (and parallel tests) build it once
        if python.exists():
            return python
        logger.warning("reasoning-gym: building a grader environment for the sandbox in %s (once)", target)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=home))
        try:
            subprocess.run([system, "-m", "venv", str(building)], check=True, capture_output=True)
            subprocess.run([str(building / "bin" / "python3"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            f"reasoning-gym=={release}"], check=True, capture_output=True, timeout=900)
            subprocess.run(["chmod", "-R", "a+rX", str(building)], check=True)
            for parent in (home, *home.parents):  # every directory above it must be traversable
                if parent == Path(parent.anchor):
                    break
                if not os.stat(parent).st_mode & 0o001:
                    os.chmod(parent, os.stat(parent).st_mode | 0o111)
            building.rename(target)
        except (OSError, subprocess.SubprocessError) as exc:
            shutil.rmtree(building, ignore_errors=True)
            detail = getattr(exc, "stderr", b"") or b""
            tail = detail.decode(errors="replace").strip().splitlines()[-1:] if detail else []
            raise GraderPythonError(f"could not build a grader environment in {target}: {exc}"
                                    + (f" ({tail[0]})" if tail else "")) from exc
    return python


def resolve_python(backend: Any, python: str = "auto", *, path: str = "rollout.environment_options.python") -> str:
    """The interpreter the scorer runs with in ``backend``'s sandboxes (see the module docstring)."""
    release = host_release()
    if python != "auto":
        found, why = probe(backend, python)
        if found != release:
            raise GraderPythonError(
                f"{path}: {python!r} in the sandbox " + (f"has reasoning_gym {found}" if found else f"fails ({why})")
                + f"; it must import reasoning_gym {release}, as on the host (or set python = \"auto\")")
        return python
    tried = []
    for candidate in (sys.executable, "python3"):
        found, why = probe(backend, candidate)
        if found == release:
            return candidate
        tried.append(f"{candidate}: " + (f"reasoning_gym {found}" if found else why))
    try:
        built = str(_build(release))
    except GraderPythonError as exc:
        raise GraderPythonError(f"{path}: no interpreter the sandbox can run imports reasoning_gym {release} "
                                f"({'; '.join(tried)}; {exc}); set {path} to one that does") from None
    found, why = probe(backend, built)
    if found != release:
        raise GraderPythonError(f"{path}: the grader environment {built} does not work in the sandbox ({why}); "
                                f"set {path} to an interpreter that imports reasoning_gym {release}")
    return built
