"""What this host lets a local backend do, probed once per process by trying it.

Every probe runs the real mechanism (a namespace is unshared, a tmpfs mounted, a cgroup made)
rather than reading version numbers or config files: containers, seccomp profiles and kernel
settings make "should work" and "works" differ.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile

from relayrl.sandbox.cgroups import cgroup_support

__all__ = ["HostSupport", "host_support", "try_command"]


@dataclasses.dataclass(frozen=True)
class HostSupport:
    """Results of the probes; ``reasons`` says why each missing piece is missing."""

    root: bool
    namespaces: bool
    """``unshare --net --pid --fork --mount --mount-proc`` works (as root, or in a user namespace)."""
    user_namespace: bool
    setpriv: bool
    prlimit: bool
    tmpfs: bool
    """A size-capped tmpfs can be mounted on the host (workspace disk quota)."""
    cgroup: str | None
    reasons: dict[str, str]


def try_command(argv: list[str], timeout: float = 10.0) -> tuple[bool, str]:
    """Run a probe; ``(succeeded, one-line reason when it did not)``."""
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]} is not installed"
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{' '.join(argv[:3])}: {exc}"
    if result.returncode != 0:
        return False, f"{' '.join(argv)} failed: {' '.join(result.stderr.split())[:200]}"
    return True, ""


def _probe_tmpfs() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "mounting a tmpfs needs root"
    directory = tempfile.mkdtemp(prefix="relayrl-probe-")
    try:
        ok, reason = try_command(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", directory])
        if ok:
            subprocess.run(["umount", directory], check=False)
        return ok, reason
    finally:
        os.rmdir(directory)


@functools.lru_cache(maxsize=1)
def host_support() -> HostSupport:
    """Probe the host (cached for the process)."""
    reasons: dict[str, str] = {}
    root = os.geteuid() == 0
    namespace_argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "true"]
    user_ns, reason = try_command(["unshare", "--user", "--map-root-user", "--net", "true"])
    if not user_ns:
        reasons["user_namespace"] = reason
    if root:
        namespaces, reason = try_command(namespace_argv)
    else:
        namespaces, reason = try_command(["unshare", "--user", "--map-root-user", *namespace_argv[1:]])
    if not namespaces:
        reasons["namespaces"] = reason
    setpriv, reason = try_command(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"]) if root \
        else (False, "dropping to another uid needs root")
    if not setpriv:
        reasons["setpriv"] = reason
    prlimit, reason = try_command(["prlimit", "--nofile=256", "true"])
    if not prlimit:
        reasons["prlimit"] = reason
    tmpfs, reason = _probe_tmpfs()
    if not tmpfs:
        reasons["tmpfs"] = reason
    cgroup, reason = cgroup_support() if root else (None, "creating cgroups needs root (or a delegated cgroup)")
    if cgroup is None:
        reasons["cgroup"] = reason
    return HostSupport(root=root, namespaces=namespaces, user_namespace=user_ns, setpriv=setpriv,
                       prlimit=prlimit, tmpfs=tmpfs, cgroup=cgroup, reasons=reasons)
