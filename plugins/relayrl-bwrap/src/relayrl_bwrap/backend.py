"""``BwrapBackend``: relayrl-sandbox's local machinery with bubblewrap as the isolation layer."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Sequence

from relayrl.sandbox.host import HostSupport, try_command
from relayrl.sandbox.local import LocalBackend, LocalSandbox

__all__ = ["BwrapBackend", "probe_bwrap"]

_PROBE = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
"""What the probe mounts: it asks only whether bwrap can build a sandbox here at all."""


@functools.lru_cache(maxsize=4)
def probe_bwrap(as_other_uid: bool) -> tuple[bool, str]:
    """Whether bwrap can build a full sandbox here (as an unprivileged uid when ``as_other_uid``)."""
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)"
    argv = ["bwrap", *_PROBE, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "true"]
    if as_other_uid:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", *argv]
    return try_command(argv)


class BwrapBackend(LocalBackend):
    """Sandboxes whose commands run under bubblewrap; see the package README for the command line."""

    name = "bwrap"

    def probe(self, support: HostSupport) -> tuple[set[str], dict[str, str]]:
        drop_uid = support.root and support.setpriv
        works, reason = probe_bwrap(drop_uid)
        if not works or not support.prlimit:
            reason = reason or support.reasons.get("prlimit", "prlimit missing")
            return set(), {name: reason for name in ("network-none", "pid-isolation", "readonly-system", "unprivileged",
                                                     "memory-limit", "process-limit", "disk-quota", "tree-kill")}
        provided, reasons = self.host_properties(support)
        provided |= {"network-none", "pid-isolation", "readonly-system", "tree-kill"}
        return provided, reasons

    # bwrap copies the host's mounts and then remounts each one read-only: another sandbox's
    # workspace, unmounted in between, fails the whole set-up. ``--block-fd`` tells that apart
    # from a command that ran and failed, so the command is run again.
    signals_start = True

    def wrap(self, sandbox: LocalSandbox, argv: Sequence[str], cwd: str, *, start_fd: int | None = None) -> list[str]:
        tmp_size = str(min(self.limits.disk_bytes, self.limits.memory_bytes))
        workdir = str(sandbox.workdir)
        hidden_directories, hidden_files = self.masks(sandbox)
        masks = [*(arg for path in hidden_directories for arg in ("--tmpfs", path)),
                 *(arg for path in hidden_files for arg in ("--ro-bind", "/dev/null", path))]
        # The sandbox's root is built from nothing: the visible host paths (relayrl.sandbox.view),
        # the same symlinks where the host has them (/bin -> usr/bin), read-only ...
        visible = self.visible()
        view = [arg for path in visible for arg in (("--symlink", os.readlink(path), path) if os.path.islink(path)
                                                    else ("--ro-bind", path, path))]
        bwrap = ["bwrap", *view, "--dev", "/dev", "--proc", "/proc",
                 "--size", tmp_size, "--tmpfs", "/tmp", "--size", tmp_size, "--tmpfs", "/var/tmp",
                 # ... other sandboxes, graders included, disappear under an empty tmpfs if a visible path holds them ...
                 *(arg for path in self.covered(visible) for arg in ("--tmpfs", path)),
                 # ... and this workspace comes in, writable.
                 "--bind", workdir, workdir, "--chdir", cwd,
                 *masks,
                 "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--hostname", "sandbox", "--cap-drop", "ALL",
                 *(["--block-fd", str(start_fd)] if start_fd is not None else [])]
        if self.network == "host":
            bwrap.append("--share-net")
        drop = []
        if sandbox.uid is not None:
            drop = ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--no-new-privs",
                    "--inh-caps=-all", "--bounding-set=-all", "--"]
        # bwrap's outer process exits without reaping its in-sandbox init, which is then
        # reparented to the host's PID 1; where that is not a real init, zombies pile up and stay
        # charged to the pids cgroup until forks fail. An outer PID namespace (as root) whose init
        # is the outer bwrap makes the kernel reap everything when it exits.
        reaper = ["unshare", "--pid", "--fork", "--kill-child", "--"] if self.support.root else []
        # No RLIMIT_NPROC: the pids cgroup limits processes, and the kernel's per-uid count also
        # includes those zombies of other commands.
        return ["prlimit", *self.rlimit_args(nproc=False), "--", *reaper, *drop, *bwrap, "--", *argv]
