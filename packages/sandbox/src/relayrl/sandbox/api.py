"""The sandbox protocol: what every backend provides, and the records it returns.

A *backend* (registered through ``relayrl_sandbox_backends``) creates *sandboxes*. A sandbox owns a
private copy of a workspace and runs commands in it under :class:`Limits`::

    from relayrl.sandbox import Limits, open_backend

    backend = open_backend("process", limits=Limits(wall_time_s=10))
    with backend.create("path/to/workspace") as sandbox:
        result = sandbox.exec("python3 -c 'print(6 * 7)'", timeout=5)
        assert result.stdout == "42\\n" and result.exit_status == 0
        sandbox.write_file("notes.txt", "hello")
        assert sandbox.read_file("notes.txt") == b"hello"

Isolation properties are named :data:`CAPABILITIES`. A backend reports those the host lets it
provide; :func:`require_capabilities` turns a missing one into :class:`SandboxUnavailable` before
anything runs, so a sandbox is never silently weaker than its config asks.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import msgspec

from relayrl.core.errors import RelayrlError

__all__ = ["CAPABILITIES", "TRUNCATION_MARKER", "ExecResult", "Limits", "Sandbox", "SandboxBackend", "SandboxError",
           "SandboxUnavailable", "require_capabilities"]

TRUNCATION_MARKER = "\n[... output truncated by the sandbox: {dropped} more bytes not shown ...]\n"
"""Appended to a stream cut at ``Limits.max_output_bytes`` (``{dropped}`` is filled in)."""

CAPABILITIES: dict[str, str] = {
    "network-none": "no network but a private loopback (own network namespace)",
    "pid-isolation": "own PID namespace: host processes are invisible and cannot be signalled",
    "readonly-system": "a sandbox sees, read-only, only the system directories and the paths exposed to it (an "
                       "allowlist), plus its own workspace; /tmp, /var/tmp and /dev/shm are private",
    "unprivileged": "commands run as a per-sandbox non-root uid with no capabilities",
    "memory-limit": "a memory cgroup caps the sandbox's resident memory (OOM-kill beyond it)",
    "process-limit": "a pids cgroup caps the number of processes and threads (fork bombs)",
    "disk-quota": "the workspace lives on a size-capped tmpfs, so many files cannot fill the host disk",
    "tree-kill": "every process a command starts is killed when it returns or times out, daemons included",
}
"""Isolation properties a config can require, with what each guarantees."""


class SandboxError(RelayrlError):
    """A sandbox operation failed (path outside the workspace, sandbox closed, host set-up error)."""


class SandboxUnavailable(SandboxError):
    """The host cannot provide an isolation property the config requires; nothing was started."""


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource limits of one sandbox. Every field has a default; 0 disables a limit where noted."""

    wall_time_s: float = 60.0
    """Default and maximum timeout of one ``exec`` (a larger ``timeout`` argument is clamped)."""
    cpu_time_s: int = 60
    """RLIMIT_CPU of every process (seconds of CPU; SIGXCPU, then SIGKILL); 0: none."""
    memory_bytes: int = 2 * 1024**3
    """Memory cgroup limit of the whole sandbox (all concurrent commands together)."""
    address_space_bytes: int = 0
    """RLIMIT_AS per process; 0: none when a memory cgroup enforces ``memory_bytes``, else ``memory_bytes``;
    -1: none at all (a CUDA process reserves far more address space than it ever uses, and fails to
    load under any limit near ``memory_bytes``; then only a memory cgroup bounds its memory)."""
    max_processes: int = 256
    """pids cgroup limit (processes + threads) of the whole sandbox; also RLIMIT_NPROC of its uid."""
    max_file_bytes: int = 256 * 1024**2
    """RLIMIT_FSIZE: largest file a command can write; 0: none."""
    disk_bytes: int = 1024**3
    """Size of the workspace tmpfs (``disk-quota``); also caps private /tmp."""
    max_open_files: int = 1024
    """RLIMIT_NOFILE; 0: the caller's."""
    max_output_bytes: int = 64 * 1024
    """Bytes of stdout (and, separately, stderr) kept per command; the rest is dropped with a marker."""
    output_kill_factor: int = 64
    """A command writing more than ``factor * max_output_bytes`` to one stream is killed (output flood)."""

    def effective_address_space(self, has_memory_cgroup: bool) -> int:
        """The RLIMIT_AS to set on every process (0: none)."""
        if self.address_space_bytes < 0:
            return 0
        if self.address_space_bytes:
            return self.address_space_bytes
        return 0 if has_memory_cgroup else self.memory_bytes


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one command did. ``exit_status`` is the shell convention: 128 + N when killed by signal N."""

    stdout: str
    stderr: str
    exit_status: int
    wall_time_s: float
    timed_out: bool = False
    truncated: bool = False
    """True when stdout or stderr was cut at ``max_output_bytes`` (the marker says how much)."""
    killed_reason: str | None = None
    """``timeout``, ``output-limit``, ``memory-limit`` or None."""
    cpu_time_s: float = 0.0
    peak_memory_bytes: int = 0
    """Peak of the sandbox's memory cgroup when available, else the largest child's max RSS."""

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout, then stderr when there is any (what a tool result shows the model)."""
        if not self.stderr:
            return self.stdout
        return self.stdout + (self.stderr if not self.stdout or self.stdout.endswith("\n") else "\n" + self.stderr)

    def usage(self) -> dict[str, float]:
        return {"wall_time_s": self.wall_time_s, "cpu_time_s": self.cpu_time_s,
                "peak_memory_bytes": float(self.peak_memory_bytes)}


class Sandbox(abc.ABC):
    """One isolated workspace. Use as a context manager or call :meth:`close`.

    Paths given to :meth:`read_file`, :meth:`write_file` and :meth:`list_files` are relative to the
    workspace; absolute paths, ``..`` and symlinks leading out of it raise :class:`SandboxError`.
    Methods may be called from several threads at once (the tools run a turn's calls concurrently).
    """

    workdir: Path
    """The workspace directory, as the host and (for the built-in backends) the commands see it."""

    @abc.abstractmethod
    def exec(self, command: str | Sequence[str], *, timeout: float | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | str | None = None,
             cwd: str | None = None) -> ExecResult:
        """Run ``command`` (a string for ``bash -c``, or an argv) in the workspace and wait for it.

        ``timeout`` defaults to and is clamped by ``Limits.wall_time_s``; on expiry the command's
        whole process tree is killed. ``env`` is added to a minimal environment (the host's is not
        inherited). ``cwd`` is relative to the workspace.
        """

    @abc.abstractmethod
    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        """The bytes of workspace file ``path``, at most ``limit`` of them.

        The file is the sandbox's, hence hostile: a FIFO or device is refused, never waited on.
        """

    def read_chunks(self, path: str, *, chunk_bytes: int = 1 << 16, limit: int | None = None) -> Iterator[bytes]:
        """The bytes of workspace file ``path`` (at most ``limit``) in chunks of at most ``chunk_bytes``.

        Host-side tools stream files with it, so a file's size does not become host memory. This
        default reads the file in one :meth:`read_file` call; backends that can stream override it.
        """
        data = self.read_file(path, limit=limit)
        for start in range(0, len(data), chunk_bytes):
            yield data[start:start + chunk_bytes]

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace workspace file ``path`` (parents created), owned by the sandbox user."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill everything still running, remove the workspace and every host resource. Idempotent."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxBackend(abc.ABC):
    """Creates sandboxes. Built by a factory from ``relayrl_sandbox_backends``."""

    name: str = ""

    @abc.abstractmethod
    def capabilities(self) -> frozenset[str]:
        """The :data:`CAPABILITIES` this backend provides on this host (probed, cached)."""

    @abc.abstractmethod
    def create(self, workspace: str | Path | None = None, *, hide: Iterable[str | Path] = ()) -> Sandbox:
        """A new sandbox whose workspace is a private copy of directory ``workspace`` (or empty).

        ``hide``: host paths its commands must not see (a task's hidden tests and gold patch), in
        addition to the backend's own list; directories appear empty, files empty.
        """

    def expose(self, paths: Iterable[str | Path]) -> None:  # noqa: B027 - a default that adds nothing, on purpose
        """Let sandboxes created from now on see host ``paths`` read-only: what a command needs beyond
        the system directories (an interpreter in a virtual environment, say). Backends that build a
        sandbox's view from an allowlist (the built-in ones: :mod:`relayrl.sandbox.view`) add them to
        it; this default does nothing, for backends whose sandboxes bring their own file system."""


def require_capabilities(backend_name: str, provided: Iterable[str], required: Iterable[str],
                         reasons: Mapping[str, str] | None = None) -> None:
    """Raise :class:`SandboxUnavailable` naming every required capability the backend lacks, and why."""
    unknown = sorted(set(required) - set(CAPABILITIES))
    if unknown:
        raise SandboxError(f"unknown sandbox capabilities {unknown} (known: {', '.join(sorted(CAPABILITIES))})")
    missing = sorted(set(required) - set(provided))
    if missing:
        details = "; ".join(f"{name} ({CAPABILITIES[name]}){': ' + reasons[name] if reasons and name in reasons else ''}"
                            for name in missing)
        raise SandboxUnavailable(
            f"sandbox backend {backend_name!r} cannot provide required isolation on this host: {details}. "
            f"Fix the host, choose another backend, or remove them from [sandbox] require knowingly.")

