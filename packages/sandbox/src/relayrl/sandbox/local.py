"""Machinery shared by sandboxes that run on this host: workspace volume, uid, cgroups, file access.

:class:`LocalBackend` and :class:`LocalSandbox` are public so that a plugin backend (``relayrl-bwrap``)
only decides how a command is wrapped (:meth:`LocalBackend.wrap`) and which capabilities that gives
(:meth:`LocalBackend.probe`). Everything else is shared:

* each sandbox gets a directory ``<root>/<id>`` (mode 0711, root-owned) whose ``workspace`` is a
  tmpfs of ``Limits.disk_bytes`` (``disk-quota``), owned by a uid of its own, so one sandbox cannot
  read another's workspace, let alone a grader's;
* a cgroup per sandbox carries the memory and pids limits, a child cgroup per command finds its
  processes for the tree kill;
* the host reads and writes workspace files without following symlinks (:mod:`relayrl.sandbox.paths`);
* each sandbox records its owner process and what it holds (``owner.json``), so that the sandboxes
  of an owner killed without closing them are reaped by the next process that creates one
  (:mod:`relayrl.sandbox.reaper`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import stat
import subprocess
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from relayrl.core.processes import start_time
from relayrl.sandbox.api import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxBackend,
    SandboxError,
    require_capabilities,
)
from relayrl.sandbox.cgroups import CgroupError, SandboxCgroup
from relayrl.sandbox.execution import StartSignal, run_wrapped
from relayrl.sandbox.holder import host_unix_sockets
from relayrl.sandbox.host import HostSupport, host_support
from relayrl.sandbox.paths import read_beneath, read_chunks_beneath, relative_parts, walk_beneath, write_beneath
from relayrl.sandbox.reaper import maybe_reap, write_owner
from relayrl.sandbox.view import normalized, visible_paths, within

__all__ = ["DEFAULT_ROOT", "SETUP_ATTEMPTS", "UID_RANGE", "LocalBackend", "LocalSandbox", "default_root"]

DEFAULT_ROOT = "/var/lib/relayrl-sandbox"
"""Where sandboxes live when running as root (``RELAYRL_SANDBOX_ROOT`` overrides). Not under /tmp:
commands get a private /tmp, which would hide a workspace below it."""

UID_RANGE = (1_200_000, 1_260_000)
"""Uids handed to sandboxes (no passwd entries needed); claimed with a lock file per uid."""

SETUP_ATTEMPTS = 3
"""How often a command whose sandbox set-up failed before it started is tried (see
:attr:`LocalBackend.signals_start`)."""

_PRIVATE_MOUNTS = ("/tmp", "/var/tmp", "/dev/shm")

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp",
            "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "GIT_PAGER": "cat",
            "PAGER": "cat"}
"""The whole environment of a command (plus its ``env``): nothing of the host's leaks in."""


def default_root() -> str:
    configured = os.environ.get("RELAYRL_SANDBOX_ROOT")
    if configured:
        return configured
    if os.geteuid() == 0:
        return DEFAULT_ROOT
    return str(Path.home() / ".cache" / "relayrl" / "sandboxes")


class LocalBackend(SandboxBackend):
    """Base of backends that run commands on this host. Subclasses define :meth:`wrap` and :meth:`probe`."""

    name = "local"

    def __init__(self, *, limits: Limits | None = None, require: Iterable[str] = (), network: str = "none",
                 root: str | None = None, hide_paths: Iterable[str] = (), expose_paths: Iterable[str] = ()) -> None:
        if network not in ("none", "host"):
            raise SandboxError(f"network must be 'none' or 'host', got {network!r}")
        self.limits = limits or Limits()
        self.network = network
        self.root = Path(root or default_root())
        for private in _PRIVATE_MOUNTS:
            if self.root == Path(private) or Path(private) in self.root.parents:
                raise SandboxError(f"sandbox root {self.root} is under {private}, which commands see as a private "
                                   f"mount; choose another root ([sandbox] root or RELAYRL_SANDBOX_ROOT)")
        # A task's own secrets (source, hidden tests, gold patch, its task set) are hidden per sandbox:
        # relayrl.sandbox.workspace.task_private_paths.
        self.hide_paths = [str(Path(path).resolve()) for path in hide_paths]
        self.exposed: list[str] = []
        """Host paths exposed to sandboxes besides the system's (:mod:`relayrl.sandbox.view`)."""
        self.expose(expose_paths)
        self.support: HostSupport = host_support()
        provided, self.reasons = self.probe(self.support)
        if network == "host":
            provided.discard("network-none")
        self._capabilities = frozenset(provided)
        self.required = frozenset(require) | ({"network-none"} if network == "none" else frozenset())
        require_capabilities(self.name, self._capabilities, self.required, self.reasons)

    # -------------------------------------------------------------------------- for subclasses
    def probe(self, support: HostSupport) -> tuple[set[str], dict[str, str]]:
        """``(capabilities, reasons for the missing ones)`` on a host with ``support``."""
        raise NotImplementedError

    @staticmethod
    def host_properties(support: HostSupport) -> tuple[set[str], dict[str, str]]:
        """The properties every local backend gets from the host alone: a dropped uid, cgroups, tmpfs.

        Backends add what their isolation layer provides (namespaces, bwrap) in their own :meth:`probe`.
        """
        provided: set[str] = set()
        reasons: dict[str, str] = {}
        if support.root and support.setpriv:
            provided.add("unprivileged")
        else:
            # Without root every sandbox runs as the calling user: not root, but not a uid of its
            # own either, so sandboxes could read each other's workspaces.
            reasons["unprivileged"] = support.reasons.get("setpriv", "setpriv failed")
        if support.cgroup:
            provided |= {"memory-limit", "process-limit"}
        else:
            reasons["memory-limit"] = reasons["process-limit"] = support.reasons.get("cgroup", "no cgroup")
        if support.tmpfs:
            provided.add("disk-quota")
        else:
            reasons["disk-quota"] = support.reasons.get("tmpfs", "cannot mount tmpfs")
        return provided, reasons

    def wrap(self, sandbox: LocalSandbox, argv: Sequence[str], cwd: str) -> list[str]:
        """The argv that runs ``argv`` isolated inside ``sandbox``, in directory ``cwd`` (absolute).

        A backend whose :attr:`signals_start` is true takes a keyword ``start_fd`` too: the
        descriptor of a :class:`~relayrl.sandbox.execution.StartSignal` its wrapper reads one byte
        from when its set-up is done, just before the command starts.
        """
        raise NotImplementedError

    signals_start: bool = False
    """Whether :meth:`wrap` takes ``start_fd``: then a command whose wrapper failed to set the
    sandbox up before the command started (a race with the host's mount table, say) is run again,
    up to :data:`SETUP_ATTEMPTS` times in all."""

    # -------------------------------------------------------------------------- shared
    def prepare(self, sandbox: LocalSandbox) -> None:
        """Per-sandbox set-up after its workspace exists (e.g. persistent namespaces); default none."""

    def release(self, sandbox: LocalSandbox) -> None:
        """Undo :meth:`prepare` when the sandbox closes (after its processes are dead)."""

    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    def rlimit_args(self, *, nproc: bool = True) -> list[str]:
        """``prlimit`` options for the limits (hard = soft, so commands cannot raise them).

        ``nproc=False`` leaves RLIMIT_NPROC out where the per-uid count also holds processes the
        sandbox does not control (bwrap's); the pids cgroup is the real process limit. A limit of
        0 is left out (unlimited).
        """
        limits = self.limits
        args = ["--core=0"]
        for option, value in (("cpu", limits.cpu_time_s), ("fsize", limits.max_file_bytes),
                              ("nofile", limits.max_open_files)):
            if value:
                args.append(f"--{option}={value}")
        address_space = limits.effective_address_space("memory-limit" in self._capabilities)
        if address_space:
            args.append(f"--as={address_space}")
        if nproc and "unprivileged" in self._capabilities:
            args.append(f"--nproc={limits.max_processes}")  # per uid; the uid is this sandbox's own
        return args

    def create(self, workspace: str | Path | None = None, *, hide: Iterable[str | Path] = ()) -> LocalSandbox:
        maybe_reap(self.root)  # sandboxes of owners that died without closing them (SIGKILL)
        return LocalSandbox(self, workspace, hide=hide)

    def expose(self, paths: Iterable[str | Path]) -> None:
        """Let sandboxes created from now on see host ``paths`` read-only (see :mod:`relayrl.sandbox.view`)."""
        for path in paths:
            for normal in normalized(path):
                if normal not in self.exposed:
                    self.exposed.append(normal)

    def visible(self) -> list[str]:
        """The host paths a sandbox sees read-only (the system's and the exposed ones that exist)."""
        return visible_paths(self.exposed)

    def covered(self, visible: list[str]) -> list[str]:
        """Directories inside ``visible`` that a sandbox must see empty: the sandboxes' root (other
        sandboxes' workspaces, graders' included), when an exposed path holds it."""
        root = str(self.root.resolve())
        return [root] if within(root, [path for path in visible if not os.path.islink(path)]) else []

    def masks(self, sandbox: LocalSandbox) -> tuple[list[str], list[str]]:
        """``(directories, files)`` to mask in ``sandbox``'s view of the host (existing paths only).

        The hidden paths, and every unix socket bound on the host (connecting to one needs no write
        access to its file system), that lie in what a sandbox sees at all. A path below a masked
        directory, or below /tmp, /var/tmp or /dev/shm (private in every sandbox), is dropped: it is
        already invisible, and mounting on it would fail once its parent is covered.
        """
        directories: list[str] = list(_PRIVATE_MOUNTS)
        files: list[str] = []
        root = str(self.root.resolve())
        visible = [path for path in self.visible() if not os.path.islink(path)]
        hidden = set(self.hide_paths) | set(sandbox.hide) | set(host_unix_sockets())
        for path in sorted(hidden, key=lambda item: (item.count("/"), item)):
            if not within(path, visible) or within(path, directories):
                continue
            if path == "/" or root == path or root.startswith(path + "/"):
                continue  # masking it would hide the sandboxes themselves (a run directory holding the root)
            if os.path.isdir(path) and not os.path.islink(path):
                directories.append(path)
            elif os.path.lexists(path):
                files.append(path)
        return directories[len(_PRIVATE_MOUNTS):], files

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capabilities={sorted(self._capabilities)})"


class _UidClaim:
    """A uid from :data:`UID_RANGE` held by one sandbox (a lock file, so concurrent processes differ)."""

    def __init__(self, root: Path, owner: str) -> None:
        directory = root / ".uids"
        directory.mkdir(parents=True, exist_ok=True)
        for _ in range(1000):
            uid = random.randrange(*UID_RANGE)
            try:
                handle = os.open(directory / str(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(handle, "w") as claim:  # the sandbox holding it: the reaper frees orphaned claims
                claim.write(owner)
            self.uid, self.path = uid, directory / str(uid)
            return
        raise SandboxError(f"no free sandbox uid in {UID_RANGE} (stale claims in {directory}?)")

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class LocalSandbox(Sandbox):
    """A sandbox on this host; see the module docstring for what it sets up."""

    def __init__(self, backend: LocalBackend, workspace: str | Path | None, *, hide: Iterable[str | Path] = ()) -> None:
        self.backend = backend
        self.hide = [str(Path(path).resolve()) for path in hide]
        self.limits = backend.limits
        self.id = uuid.uuid4().hex[:16]
        self.directory = backend.root / self.id
        self.workdir = self.directory / "workspace"
        self._lock = threading.Lock()
        self._closed = False
        self._mounted = False
        self._prepared = False
        self.namespace_holder: subprocess.Popen[bytes] | None = None
        """The process that keeps this sandbox's persistent namespaces (``process`` as root)."""
        self._uid: _UidClaim | None = None
        self.cgroup: SandboxCgroup | None = None
        capabilities = backend.capabilities()
        try:
            backend.root.mkdir(parents=True, exist_ok=True, mode=0o711)
            self.directory.mkdir(mode=0o711)
            write_owner(self.directory)  # from here on, a reaper can undo this sandbox if its owner dies
            self.workdir.mkdir(mode=0o700)
            if "unprivileged" in capabilities:
                self._uid = _UidClaim(backend.root, self.id)
            self.owner = (self._uid.uid, self._uid.uid) if self._uid else (os.geteuid(), os.getegid())
            if "disk-quota" in capabilities:
                subprocess.run(["mount", "-t", "tmpfs", "-o",
                                f"size={backend.limits.disk_bytes},mode=0700,uid={self.owner[0]},gid={self.owner[1]}",
                                f"relayrl-{self.id}", str(self.workdir)], check=True, capture_output=True)
                self._mounted = True
            if workspace is not None:
                source = Path(workspace)
                if not source.is_dir():
                    raise SandboxError(f"workspace {source}: not a directory")
                shutil.copytree(source, self.workdir, symlinks=True, dirs_exist_ok=True)
            self._chown_tree()
            if "memory-limit" in capabilities or "process-limit" in capabilities:
                self.cgroup = SandboxCgroup(backend.support.cgroup or "v1", f"sb-{self.id}",
                                            memory_bytes=backend.limits.memory_bytes,
                                            max_processes=backend.limits.max_processes)
            self._prepared = True  # before: release() must undo a prepare() that failed half-way
            backend.prepare(self)
            holder = self.namespace_holder
            write_owner(self.directory, uid=self.uid,
                        cgroup=[str(path) for path in self.cgroup.directories] if self.cgroup else None,
                        holder_pid=holder.pid if holder else None,
                        holder_start=start_time(holder.pid) if holder else None)
        except (OSError, subprocess.CalledProcessError, CgroupError) as exc:
            self.close()
            raise SandboxError(f"cannot create sandbox in {self.directory}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _chown_tree(self) -> None:
        if self._uid is None:
            return
        os.lchown(self.workdir, *self.owner)
        for relative, _ in walk_beneath(str(self.workdir)):
            os.lchown(self.workdir / relative, *self.owner)

    @property
    def uid(self) -> int | None:
        """The uid commands run as (None when they run as the calling user)."""
        return self._uid.uid if self._uid else None

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    def exec(self, command: str | Sequence[str], *, timeout: float | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | str | None = None,
             cwd: str | None = None) -> ExecResult:
        self._check_open()
        argv = ["/bin/bash", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise SandboxError("empty command")
        limit = self.limits.wall_time_s
        timeout = limit if timeout is None else max(0.0, min(float(timeout), limit))
        directory = self.workdir.joinpath(*relative_parts(cwd)) if cwd else self.workdir
        environment = {**BASE_ENV, **(env or {})}
        data = stdin.encode() if isinstance(stdin, str) else stdin
        oom_before = self.cgroup.oom_kills() if self.cgroup else 0
        for _attempt in range(SETUP_ATTEMPTS):
            command_cgroup = self.cgroup.command() if self.cgroup else None
            command_oom = 0
            start = StartSignal() if self.backend.signals_start else None
            try:
                wrapped = (self.backend.wrap(self, argv, str(directory), start_fd=start.fd) if start
                           else self.backend.wrap(self, argv, str(directory)))
                result = run_wrapped(wrapped, limits=self.limits, timeout=timeout, env=environment,
                                     cwd=str(directory), cgroup=command_cgroup, stdin=data,
                                     pass_fds=(start.fd,) if start else ())
                never_started = start is not None and not start.started() and not result.timed_out
            finally:
                if start is not None:
                    start.close()
                if command_cgroup is not None:
                    command_oom = command_cgroup.oom_kills()  # before it goes: cgroup v1 counts them only there
                    command_cgroup.remove()
            if not never_started:
                break
        if self.cgroup is not None:
            peak = self.cgroup.peak_memory()
            oom = self.cgroup.oom_kills() > oom_before or command_oom > 0
            if peak or oom:
                result = dataclasses.replace(
                    result, peak_memory_bytes=peak or result.peak_memory_bytes,
                    killed_reason=result.killed_reason or ("memory-limit" if oom else None))
        return result

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        self._check_open()
        return read_beneath(str(self.workdir), path, limit=limit)

    def read_chunks(self, path: str, *, chunk_bytes: int = 1 << 16, limit: int | None = None) -> Iterator[bytes]:
        self._check_open()
        yield from read_chunks_beneath(str(self.workdir), path, chunk_bytes=chunk_bytes, limit=limit)

    def write_file(self, path: str, data: bytes | str) -> None:
        self._check_open()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        if self.limits.max_file_bytes and len(payload) > self.limits.max_file_bytes:
            raise SandboxError(f"{path}: {len(payload)} bytes exceed the sandbox's max_file_bytes")
        write_beneath(str(self.workdir), path, payload, owner=self.owner if self._uid else None)

    def list_files(self) -> list[str]:
        """Every regular file of the workspace (``.git`` excluded), relative, sorted."""
        self._check_open()
        return sorted(path for path, info in walk_beneath(str(self.workdir))
                      if stat.S_ISREG(info.st_mode) and not (path == ".git" or path.startswith(".git/")))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        errors = []
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except CgroupError as exc:
                errors.append(str(exc))
        if self._prepared:
            try:
                self.backend.release(self)
            except (OSError, SandboxError) as exc:
                errors.append(str(exc))
        if self._mounted:
            result = subprocess.run(["umount", str(self.workdir)], capture_output=True, text=True)
            if result.returncode != 0:  # still busy: detach now, the kernel frees it when unused
                subprocess.run(["umount", "--lazy", str(self.workdir)], capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._uid is not None:
            self._uid.release()
        if errors:
            raise SandboxError(f"sandbox {self.id}: cleanup failed: {'; '.join(errors)}")

    def __del__(self) -> None:  # a forgotten close must not leak mounts and cgroups
        with contextlib.suppress(Exception):
            if not self._closed:
                self.close()


def missing_reasons(support: HostSupport, *names: str) -> str:
    return "; ".join(support.reasons[name] for name in names if name in support.reasons)

