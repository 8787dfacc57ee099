"""The built-in ``process`` backend: util-linux ``unshare``, ``prlimit`` and ``setpriv`` around the command.

As root (the usual case on RL workers) a command runs as::

    unshare --net --pid --fork --kill-child --mount --mount-proc --propagation private --
      /bin/sh -c 'mount -o remount,bind,ro / && mount -t tmpfs ... /tmp && ... && "$@"'
        prlimit --cpu=.. --fsize=.. --nofile=.. --nproc=.. [--as=..] --
          setpriv --reuid=U --regid=U --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
            /bin/bash -c COMMAND

i.e. no network but its own (down) loopback, its own PID namespace whose init is the set-up shell
(when the command returns the shell exits, and the kernel kills every process left in the
namespace; ``--kill-child`` does the same when ``unshare`` is killed), a read-only view of the host with private
/tmp, /var/tmp and /dev/shm, hard rlimits, and a per-sandbox uid without capabilities, so that it can
neither undo the mounts nor write anything on the host but its workspace. Without root it falls
back to a user namespace for the network and PID namespaces and reports the rest as missing.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from relayrl.sandbox.host import HostSupport
from relayrl.sandbox.local import LocalBackend, LocalSandbox

__all__ = ["ProcessBackend"]


class ProcessBackend(LocalBackend):
    """Sandboxes made of namespaces, rlimits, cgroups and a dropped uid; see the module docstring."""

    name = "process"

    def probe(self, support: HostSupport) -> tuple[set[str], dict[str, str]]:
        provided: set[str] = set()
        reasons: dict[str, str] = {}
        if support.namespaces:
            provided |= {"network-none", "pid-isolation", "tree-kill"}
            if support.root:
                provided.add("readonly-system")
        else:
            for name in ("network-none", "pid-isolation", "readonly-system"):
                reasons[name] = support.reasons.get("namespaces", "unshare failed")
        if support.root and support.setpriv:
            provided.add("unprivileged")
        elif not support.root:
            provided.add("unprivileged")  # it already runs as the (unprivileged) calling user
        else:
            reasons["unprivileged"] = support.reasons.get("setpriv", "setpriv failed")
        if support.cgroup:
            provided |= {"memory-limit", "process-limit", "tree-kill"}
        else:
            reasons["memory-limit"] = reasons["process-limit"] = support.reasons.get("cgroup", "no cgroup")
        if support.tmpfs:
            provided.add("disk-quota")
        else:
            reasons["disk-quota"] = support.reasons.get("tmpfs", "cannot mount tmpfs")
        if not support.prlimit:
            raise_reason = support.reasons.get("prlimit", "prlimit missing")
            reasons.update({name: raise_reason for name in provided})
            provided.clear()  # rlimits are the floor of every sandbox: without them, offer nothing
        if "tree-kill" not in provided:
            reasons["tree-kill"] = "needs a PID namespace or a cgroup"
        return provided, reasons

    def wrap(self, sandbox: LocalSandbox, argv: Sequence[str], cwd: str) -> list[str]:
        capabilities = self.capabilities()
        command = ["prlimit", *self.rlimit_args(), "--", *self._drop_privileges(sandbox), *argv]
        if "pid-isolation" not in capabilities:
            return command
        namespaces = ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--propagation", "private"]
        if self.network == "none":
            namespaces.insert(0, "--net")
        if not self.support.root:
            return ["unshare", "--user", "--map-root-user", *namespaces, "--", *command]
        tmp_size = min(self.limits.disk_bytes, self.limits.memory_bytes)
        hidden_directories, hidden_files = self.masks(sandbox)
        setup = " && ".join([
            "mount -o remount,bind,ro /",
            *(f"mount -t tmpfs -o size={tmp_size},mode=1777,nosuid,nodev tmpfs {shlex.quote(path)}"
              for path in ("/tmp", "/var/tmp", "/dev/shm")),
            *(f"mount -t tmpfs -o size=4k,mode=0555 tmpfs {shlex.quote(path)}" for path in hidden_directories),
            *(f"mount --bind /dev/null {shlex.quote(path)}" for path in hidden_files),
            # Not exec: this shell stays PID 1 of the namespace and reports a signal death as
            # 128+N (unshare 2.38 turns it into 1), and the command does not run as an init
            # that the kernel protects from its own signals.
            '"$@"',
        ])
        return ["unshare", *namespaces, "--", "/bin/sh", "-c", setup, "relayrl-setup", *command]

    def _drop_privileges(self, sandbox: LocalSandbox) -> list[str]:
        if sandbox.uid is None:
            return []
        return ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
