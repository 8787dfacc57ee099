"""The built-in ``process`` backend: util-linux ``unshare``, ``prlimit`` and ``setpriv`` around the command.

As root (the usual case on RL workers) each sandbox gets, once, a mount, an IPC and a network
namespace, kept alive by a holder process (:mod:`relayrl.sandbox.holder`), whose root holds only
what a sandbox may see (:mod:`relayrl.sandbox.view`: the system directories and exposed paths,
read-only, and the workspace), /tmp, /var/tmp, /dev/shm and the masked task data are private tmpfs,
and the host's unix sockets are masked; then each command runs as::

    nsenter --target HOLDER --mount --root --ipc --net --
      unshare --pid --fork --kill-child --mount-proc -- /bin/sh -c 'cd -- "$0" || exit 126; "$@"' CWD
        prlimit --cpu=.. --fsize=.. --nofile=.. --nproc=.. [--as=..] --
          setpriv --reuid=U --regid=U --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
            /bin/bash -c COMMAND

i.e. no network but its own (down) loopback, no SysV IPC object or POSIX message queue shared with
the host or another sandbox, a PID namespace per command whose init is a shell
(when the command returns the shell exits, and the kernel kills every process left in the
namespace; ``--kill-child`` does the same when ``unshare`` is killed), a read-only allowlisted view
of the host with private /tmp, /var/tmp and /dev/shm (kept for the sandbox's life, like a machine's), hard
rlimits, and a per-sandbox uid without capabilities, so that it can neither undo the mounts nor
write anything on the host but its workspace. Without root the holder runs in a user namespace of
the caller's (``unshare --user --map-root-user``), which may own and remount mount namespaces: the
same allowlisted view, private directories and masks, and commands that hold no capability in it;
what needs root (a uid per sandbox, cgroups, a tmpfs workspace) is reported missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from relayrl.sandbox import holder
from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.host import HostSupport
from relayrl.sandbox.local import LocalBackend, LocalSandbox

__all__ = ["ProcessBackend"]

_HOLDER_SOURCE = Path(holder.__file__).read_text(encoding="utf-8")


class ProcessBackend(LocalBackend):
    """Sandboxes made of namespaces, rlimits, cgroups and a dropped uid; see the module docstring."""

    name = "process"

    def probe(self, support: HostSupport) -> tuple[set[str], dict[str, str]]:
        provided, reasons = self.host_properties(support)
        if support.namespaces:
            # As root, or in a user namespace of the caller's (mount namespaces it owns may be
            # remounted read-only and masked): the holder process sets it up either way.
            provided |= {"network-none", "pid-isolation", "tree-kill", "readonly-system"}
        else:
            for name in ("network-none", "pid-isolation", "readonly-system"):
                reasons[name] = support.reasons.get("namespaces", "unshare failed")
        if support.cgroup:
            provided.add("tree-kill")
        if not support.prlimit:
            raise_reason = support.reasons.get("prlimit", "prlimit missing")
            reasons.update({name: raise_reason for name in provided})
            provided.clear()  # rlimits are the floor of every sandbox: without them, offer nothing
        if "tree-kill" not in provided:
            reasons["tree-kill"] = "needs a PID namespace or a cgroup"
        return provided, reasons

    def _persistent(self) -> bool:
        return "pid-isolation" in self.capabilities()

    def prepare(self, sandbox: LocalSandbox) -> None:
        """As root: build the sandbox's mount, IPC (and network) namespaces once, held by a process.

        Each command then only enters them and adds a PID namespace, instead of re-creating the
        namespaces and re-mounting everything: half the processes per tool call.
        """
        if not self._persistent():
            return
        hidden_directories, hidden_files = self.masks(sandbox)
        new_root = sandbox.directory / "root"
        new_root.mkdir(mode=0o755)
        visible = self.visible()
        spec = {"new_root": str(new_root), "visible": visible, "covered": self.covered(visible),
                "keep_writable": [str(sandbox.workdir)], "private": ["/tmp", "/var/tmp", "/dev/shm"],
                "tmp_size": min(self.limits.disk_bytes, self.limits.memory_bytes),
                "hidden_directories": hidden_directories, "hidden_files": hidden_files}
        namespaces = [*([] if self.support.root else ["--user", "--map-root-user"]), "--mount", "--ipc",
                      *(["--net"] if self.network == "none" else [])]
        process = subprocess.Popen(
            ["unshare", *namespaces, "--propagation", "private", "--",
             sys.executable, "-I", "-S", "-c", _HOLDER_SOURCE, json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})
        sandbox.namespace_holder = process
        ready = process.stdout.readline() if process.stdout is not None else b""
        if ready.strip() != b"ready":
            process.kill()
            error = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
            raise SandboxError(f"cannot set up the sandbox's namespaces: {error or 'the holder exited'}")

    def release(self, sandbox: LocalSandbox) -> None:
        process = getattr(sandbox, "namespace_holder", None)
        if process is None:
            return
        process.kill()  # the namespaces go with their last process
        process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()

    def wrap(self, sandbox: LocalSandbox, argv: Sequence[str], cwd: str) -> list[str]:
        capabilities = self.capabilities()
        command = ["prlimit", *self.rlimit_args(), "--", *self._drop_privileges(sandbox), *argv]
        if "pid-isolation" not in capabilities:
            return command
        holder = sandbox.namespace_holder
        assert holder is not None, "prepare() builds the namespaces before any command"
        if holder.returncode is not None or _state(holder.pid) in ("Z", "X", None):
            raise SandboxError(f"sandbox {sandbox.id}: its namespace holder (pid {holder.pid}) is gone")
        # The holder is never reaped before release(): its PID cannot name another process meanwhile.
        # --root: the holder's root, the view it built (see relayrl.sandbox.holder), not the host's.
        enter = ["nsenter", f"--target={holder.pid}", *([] if self.support.root else ["--user", "--preserve-credentials"]),
                 "--mount", "--root", "--ipc",
                 *(["--net"] if self.network == "none" else [])]
        # A fresh PID namespace per command: its init is a shell, not the command (unshare 2.38
        # reports a signal death as status 1, and an init is shielded from its own signals);
        # when the command returns the shell exits and the kernel kills the rest. The shell also
        # changes directory: nsenter --wd resolves the path in the host's namespace, which
        # leaves the command with a working directory unreachable from its root.
        return [*enter, "--", "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
                "/bin/sh", "-c", 'cd -- "$0" || exit 126; "$@"', cwd, *command]

    def _drop_privileges(self, sandbox: LocalSandbox) -> list[str]:
        if sandbox.uid is None:
            # Without root the command is uid 0 of a user namespace of the caller's: it must hold no
            # capability there, or it could remount the read-only host or unmount the masks.
            return ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        return ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``Z`` ...), None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
