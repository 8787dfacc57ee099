"""Run one wrapped command: join its cgroup, capture capped output, enforce the timeout, kill its tree.

This is the part every local backend shares. A backend turns the user's command into an argv that
applies its isolation (``unshare ...``, ``bwrap ...``); :func:`run_wrapped` runs that argv and
guarantees, whatever the command does, that:

* stdout and stderr are each kept up to ``max_output_bytes`` and the rest dropped with a marker;
  a command that floods far beyond that is killed rather than read forever;
* at the deadline the whole process group is SIGKILLed, then every process left in the command's
  cgroup (children that called ``setsid`` leave the process group but never the cgroup);
* when the command returns, the same sweep runs, so an orphaned or daemonised child never outlives
  its command.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from relayrl.sandbox.api import TRUNCATION_MARKER, ExecResult, Limits
from relayrl.sandbox.cgroups import CommandCgroup

__all__ = ["StartSignal", "join_cgroup_prefix", "run_wrapped"]

_READ_CHUNK = 65536


def join_cgroup_prefix(procs_files: Sequence[os.PathLike[str] | str]) -> list[str]:
    """An argv prefix that moves itself into the given cgroups, then execs the rest of the argv.

    A shell rather than ``preexec_fn``: the tools run several commands from threads at once, and
    ``preexec_fn`` is documented as unsafe in a threaded parent.
    """
    if not procs_files:
        return []
    joins = " && ".join(f"echo $$ > {shlex.quote(str(path))}" for path in procs_files)
    return ["/bin/sh", "-c", f'{joins} && exec "$@"', "relayrl-sandbox"]


class StartSignal:
    """Tells whether a wrapped command got past its wrapper's set-up and started.

    A pipe holding one byte, whose read end the wrapper is given (bwrap's ``--block-fd``): the
    wrapper reads the byte once the sandbox's namespaces and mounts are built, just before it execs
    the command. A byte still there when the command has returned means the set-up failed and the
    command never ran, so running it again is safe. The command cannot put the byte back: the
    wrapper closes the descriptor, and nobody holds the write end.
    """

    def __init__(self) -> None:
        self.fd, write_end = os.pipe()
        os.write(write_end, b".")
        os.close(write_end)

    def started(self) -> bool:
        os.set_blocking(self.fd, False)
        try:
            return os.read(self.fd, 1) == b""
        except BlockingIOError:  # cannot happen with the write end closed; treat as consumed
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class _Capture:
    """One output stream: keeps the first ``limit`` bytes, counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.truncated:
            text += TRUNCATION_MARKER.format(dropped=self.total - len(self.kept))
        return text


def _feed_stdin(pipe, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the command may exit without reading its input
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def run_wrapped(argv: Sequence[str], *, limits: Limits, timeout: float, env: Mapping[str, str], cwd: str,
                cgroup: CommandCgroup | None, stdin: bytes | None = None, pass_fds: Sequence[int] = ()) -> ExecResult:
    """Run ``argv`` (already wrapped by a backend) and return its :class:`ExecResult`.

    ``pass_fds`` stay open in the wrapper (e.g. a :class:`StartSignal`'s descriptor).
    """
    full_argv = [*join_cgroup_prefix(cgroup.procs_files if cgroup else []), *argv]
    start = time.monotonic()
    process = subprocess.Popen(full_argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
                               start_new_session=True, pass_fds=tuple(pass_fds))
    if stdin is not None:
        threading.Thread(target=_feed_stdin, args=(process.stdin, stdin), daemon=True).start()
    captures = {process.stdout.fileno(): _Capture(limits.max_output_bytes),
                process.stderr.fileno(): _Capture(limits.max_output_bytes)}
    flood = limits.max_output_bytes * max(1, limits.output_kill_factor)
    selector = selectors.DefaultSelector()
    for stream in (process.stdout, process.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    deadline = start + timeout
    killed_reason: str | None = None
    status: int | None = None
    rusage = None
    drain_deadline = float("inf")
    idle = 0.0005
    try:
        while True:
            if status is None and os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                # The command returned: nothing it started may outlive it (this also closes the
                # pipes that orphans inherited, so the reads below reach EOF). Kill before
                # reaping, so that the process group id cannot have been reused yet.
                _kill_tree(process.pid, cgroup)
                _, status, rusage = os.wait4(process.pid, 0)
                drain_deadline = time.monotonic() + 2.0
            if selector.get_map():
                wait = max(0.0, min(0.05, deadline - time.monotonic())) if status is None else 0.05
                for key, _ in selector.select(wait):
                    try:
                        chunk = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    capture = captures[key.fd]
                    capture.add(chunk)
                    if capture.total > flood and killed_reason is None:
                        killed_reason = "output-limit"
                        _kill_tree(process.pid, cgroup)
            elif status is not None:
                break
            else:  # both streams closed by a command that keeps running
                time.sleep(idle)
                idle = min(idle * 2, 0.01)
            now = time.monotonic()
            if status is None and killed_reason is None and now >= deadline:
                killed_reason = "timeout"
                _kill_tree(process.pid, cgroup)
            if now > drain_deadline:
                break  # a pipe is held by a process outside our reach (no cgroup): stop reading
    finally:
        selector.close()
        if status is None:
            _kill_tree(process.pid, cgroup)
            _, status, rusage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        for stream in (process.stdout, process.stderr, process.stdin):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    wall = time.monotonic() - start
    code = process.returncode
    exit_status = 128 - code if code < 0 else code
    out_capture, err_capture = list(captures.values())
    stdout, stderr = out_capture.text(), err_capture.text()
    if killed_reason == "timeout":
        stderr += f"\n[sandbox: killed after the {timeout:g} s timeout]\n"
    elif killed_reason == "output-limit":
        stderr += f"\n[sandbox: killed for writing more than {flood} bytes of output]\n"
    cpu = (rusage.ru_utime + rusage.ru_stime) if rusage is not None else 0.0
    peak = int(rusage.ru_maxrss) * 1024 if rusage is not None else 0
    return ExecResult(stdout=stdout, stderr=stderr, exit_status=exit_status, wall_time_s=wall,
                      timed_out=killed_reason == "timeout", truncated=out_capture.truncated or err_capture.truncated,
                      killed_reason=killed_reason, cpu_time_s=cpu, peak_memory_bytes=peak)


def _kill_tree(pid: int, cgroup: CommandCgroup | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill()
