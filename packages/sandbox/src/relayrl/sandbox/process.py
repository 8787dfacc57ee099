"""The built-in ``process`` backend: util-linux ``unshare``, ``prlimit`` and ``setpriv`` around the command.

As root (the usual case on RL workers) each sandbox gets, once, a mount and a network namespace
kept in files (``unshare --mount=FILE --net=FILE``) in which the host is remounted read-only and
/tmp, /var/tmp, /dev/shm and the masked task data are private tmpfs; then each command runs as::

    nsenter --mount=FILE --net=FILE --
      unshare --pid --fork --kill-child --mount-proc -- /bin/sh -c 'cd -- "$0" || exit 126; "$@"' CWD
        prlimit --cpu=.. --fsize=.. --nofile=.. --nproc=.. [--as=..] --
          setpriv --reuid=U --regid=U --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
            /bin/bash -c COMMAND

i.e. no network but its own (down) loopback, a PID namespace per command whose init is a shell
(when the command returns the shell exits, and the kernel kills every process left in the
namespace; ``--kill-child`` does the same when ``unshare`` is killed), a read-only view of the host
with private /tmp, /var/tmp and /dev/shm (kept for the sandbox's life, like a machine's), hard
rlimits, and a per-sandbox uid without capabilities, so that it can neither undo the mounts nor
write anything on the host but its workspace. Without root it falls
back to a user namespace for the network and PID namespaces and reports the rest as missing.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.host import HostSupport
from relayrl.sandbox.local import LocalBackend, LocalSandbox

__all__ = ["ProcessBackend"]


class ProcessBackend(LocalBackend):
    """Sandboxes made of namespaces, rlimits, cgroups and a dropped uid; see the module docstring."""

    name = "process"

    def probe(self, support: HostSupport) -> tuple[set[str], dict[str, str]]:
        provided, reasons = self.host_properties(support)
        if support.namespaces:
            provided |= {"network-none", "pid-isolation", "tree-kill"}
            if support.root:
                provided.add("readonly-system")
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
        return "pid-isolation" in self.capabilities() and self.support.root

    def prepare(self, sandbox: LocalSandbox) -> None:
        """As root: build the sandbox's mount (and network) namespace once, and keep it in files.

        Each command then only enters it and adds a PID namespace, instead of re-creating the
        namespaces and re-mounting everything: half the processes per tool call.
        """
        if not self._persistent():
            return
        holder = sandbox.directory / "ns"
        holder.mkdir(mode=0o700)
        sandbox.namespace_holder = holder
        # Namespace files can only be bind-mounted onto a mount with private propagation.
        _run(["mount", "--bind", str(holder), str(holder)], "bind the namespace holder")
        _run(["mount", "--make-private", str(holder)], "make the namespace holder private")
        (holder / "mnt").touch()
        namespaces = [f"--mount={holder / 'mnt'}"]
        if self.network == "none":
            (holder / "net").touch()
            namespaces.append(f"--net={holder / 'net'}")
        tmp_size = min(self.limits.disk_bytes, self.limits.memory_bytes)
        hidden_directories, hidden_files = self.masks(sandbox)
        setup = " && ".join([
            "mount -o remount,bind,ro /",
            *(f"mount -t tmpfs -o size={tmp_size},mode=1777,nosuid,nodev tmpfs {shlex.quote(path)}"
              for path in ("/tmp", "/var/tmp", "/dev/shm")),
            *(f"mount -t tmpfs -o size=4k,mode=0555 tmpfs {shlex.quote(path)}" for path in hidden_directories),
            *(f"mount --bind /dev/null {shlex.quote(path)}" for path in hidden_files),
        ])
        _run(["unshare", *namespaces, "--propagation", "private", "--", "/bin/sh", "-c", setup],
             "set up the sandbox's namespaces")

    def release(self, sandbox: LocalSandbox) -> None:
        holder = getattr(sandbox, "namespace_holder", None)
        if holder is None:
            return
        # Also after a prepare() that failed half-way: unmount whatever is mounted, innermost first.
        for target in (holder / "mnt", holder / "net", holder):
            mounted = str(target) in _mount_points()
            if mounted and subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(target)], capture_output=True)

    def wrap(self, sandbox: LocalSandbox, argv: Sequence[str], cwd: str) -> list[str]:
        capabilities = self.capabilities()
        command = ["prlimit", *self.rlimit_args(), "--", *self._drop_privileges(sandbox), *argv]
        if "pid-isolation" not in capabilities:
            return command
        if not self.support.root:
            namespaces = ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--propagation", "private"]
            if self.network == "none":
                namespaces.insert(0, "--net")
            return ["unshare", "--user", "--map-root-user", *namespaces, "--", *command]
        holder = sandbox.namespace_holder
        assert holder is not None, "prepare() builds the namespaces before any command"
        enter = ["nsenter", f"--mount={holder / 'mnt'}"]
        if self.network == "none":
            enter.append(f"--net={holder / 'net'}")
        # A fresh PID namespace per command: its init is a shell, not the command (unshare 2.38
        # reports a signal death as status 1, and an init is shielded from its own signals);
        # when the command returns the shell exits and the kernel kills the rest. The shell also
        # changes directory: nsenter --wd resolves the path in the host's namespace, which
        # leaves the command with a working directory unreachable from its root.
        return [*enter, "--", "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
                "/bin/sh", "-c", 'cd -- "$0" || exit 126; "$@"', cwd, *command]

    def _drop_privileges(self, sandbox: LocalSandbox) -> list[str]:
        if sandbox.uid is None:
            return []
        return ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SandboxError(f"cannot {what}: {' '.join(argv[:4])}: {result.stderr.strip()}")


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo") as handle:
        return {line.split()[4] for line in handle}
