"""``SandboxTests``: the conformance suite every sandbox backend passes, built in or plugin.

Subclass it and override the ``backend`` fixture; build the backend with :attr:`SandboxTests.limits`
(small, so that hostile programs hit them quickly)::

    from relayrl.sandbox.testing import SandboxTests

    class TestMyBackend(SandboxTests):
        @pytest.fixture
        def backend(self):
            return MyBackend(limits=self.limits)

The suite has two parts: the protocol (output, status, files, timeouts, concurrency) and 38
**hostile programs** (network, fork and memory bombs, disk fill, output floods, timeouts, orphans
and daemons, symlink and ``..`` escapes, writes outside the workspace, reading the grader's files,
signals to the host, tampering with limits ...). Each hostile test asserts that the program was
contained *and* that the host is left clean: no process of the sandbox survives the command (the
commands carry a token in their environment, and the sandbox's uid is checked too), and after
``close`` no workspace, mount or cgroup is left. A test whose containment relies on an isolation
property the backend does not claim on this host is skipped by capability, saying which.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relayrl.sandbox.api import TRUNCATION_MARKER, ExecResult, Limits, Sandbox, SandboxBackend, SandboxError

__all__ = ["SandboxTests", "TrackedSandbox", "stray_processes"]

MiB = 1024 * 1024
TOKEN_VARIABLE = "RELAYRL_CONFORMANCE_TOKEN"


def stray_processes(token: str, uid: int | None = None) -> list[str]:
    """Live (non-zombie) processes whose environment holds ``token`` or whose uid is ``uid``."""
    found = []
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("State", "").strip().startswith(("Z", "X")):
                continue  # exited; nothing left to run
            uids = fields.get("Uid", "").split()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except (OSError, ValueError):
            continue
        if needle in environ.split(b"\0") or (uid is not None and uids and int(uids[0]) == uid):
            found.append(f"{entry} ({fields.get('Name', '?').strip()})")
    return found


def _uid_of(status: Path) -> int | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class TrackedSandbox:
    """A sandbox whose commands carry a token in their environment, so strays can be found."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.raw = sandbox
        self.token = uuid.uuid4().hex
        self.workdir = Path(sandbox.workdir)

    def exec(self, command: Any, **kwargs: Any) -> ExecResult:
        kwargs["env"] = {**(kwargs.get("env") or {}), TOKEN_VARIABLE: self.token}
        return self.raw.exec(command, **kwargs)

    def read_file(self, path: str) -> bytes:
        return self.raw.read_file(path)

    def write_file(self, path: str, data: bytes | str) -> None:
        self.raw.write_file(path, data)

    @property
    def uid(self) -> int | None:
        return getattr(self.raw, "uid", None)

    def strays(self) -> list[str]:
        return stray_processes(self.token, self.uid)


def assert_closed_cleanly(sandbox: Sandbox, token: str) -> None:
    """After ``close``: no process, no workspace, no mount, no cgroup of the sandbox remains."""
    uid = getattr(sandbox, "uid", None)
    assert not stray_processes(token, uid), f"processes survive close: {stray_processes(token, uid)}"
    workdir = Path(sandbox.workdir)
    assert not workdir.exists(), f"workspace {workdir} survives close"
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text(), f"mount {workdir} survives close"
    for directory in getattr(getattr(sandbox, "cgroup", None), "directories", []) or []:
        assert not Path(directory).exists(), f"cgroup {directory} survives close"


class SandboxTests:
    """Conformance suite for :class:`relayrl.sandbox.api.SandboxBackend` implementations."""

    limits = Limits(wall_time_s=20.0, cpu_time_s=4, memory_bytes=256 * MiB, max_processes=64,
                    max_file_bytes=8 * MiB, disk_bytes=32 * MiB, max_open_files=256, max_output_bytes=16 * 1024,
                    output_kill_factor=64)
    """Limits the ``backend`` fixture must use: small, so hostile programs reach them in well under a second."""

    python = "python3"

    @pytest.fixture
    def backend(self) -> SandboxBackend:
        raise NotImplementedError("override the `backend` fixture to return a backend built with self.limits")

    @pytest.fixture
    def seed(self, tmp_path: Path) -> Path:
        """The workspace every sandbox of the suite starts from."""
        (tmp_path / "seed" / "pkg").mkdir(parents=True)
        (tmp_path / "seed" / "pkg" / "mod.py").write_text("VALUE = 42\n")
        (tmp_path / "seed" / "README").write_text("seed workspace\n")
        return tmp_path / "seed"

    @pytest.fixture
    def sandbox(self, backend: SandboxBackend, seed: Path) -> Iterator[TrackedSandbox]:
        raw = backend.create(seed)
        tracked = TrackedSandbox(raw)
        try:
            yield tracked
        finally:
            raw.close()
        assert_closed_cleanly(raw, tracked.token)

    @staticmethod
    def requires(backend: SandboxBackend, *capabilities: str) -> None:
        """Skip, naming the capabilities, when the backend does not provide them on this host."""
        missing = sorted(set(capabilities) - set(backend.capabilities()))
        if missing:
            reasons = getattr(backend, "reasons", {})
            detail = "; ".join(f"{name}: {reasons.get(name, 'not provided')}" for name in missing)
            pytest.skip(f"backend {backend.name!r} does not provide {', '.join(missing)} on this host ({detail})")

    def py(self, source: str) -> list[str]:
        return [self.python, "-c", source]

    @staticmethod
    def assert_no_strays(sandbox: TrackedSandbox) -> None:
        assert not sandbox.strays(), f"processes outlive their command: {sandbox.strays()}"

    # =========================================================================== protocol
    def test_exec_returns_stdout_stderr_status_and_usage(self, sandbox):
        result = sandbox.exec("echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_status) == ("out\n", "err\n", 3)
        assert not result.timed_out and not result.truncated and result.killed_reason is None
        assert result.wall_time_s > 0

    def test_argv_stdin_and_cwd(self, sandbox):
        assert sandbox.exec(["cat"], stdin=b"piped").stdout == "piped"
        assert sandbox.exec(["pwd"], cwd="pkg").stdout.strip().endswith("/pkg")
        assert sandbox.exec(self.py("import pkg.mod; print(pkg.mod.VALUE)")).stdout == "42\n"

    def test_environment_is_minimal_and_extendable(self, sandbox, monkeypatch):
        monkeypatch.setenv("RELAYRL_HOST_SECRET", "do-not-leak")
        result = sandbox.exec("env", env={"GREETING": "hi"})
        assert "GREETING=hi" in result.stdout and "RELAYRL_HOST_SECRET" not in result.stdout

    def test_files_round_trip_between_host_and_commands(self, sandbox, seed):
        sandbox.write_file("new/dir/file.txt", "from host")
        assert sandbox.exec("cat new/dir/file.txt").stdout == "from host"
        assert sandbox.exec("echo from command > made.txt && echo more >> new/dir/file.txt").ok
        assert sandbox.read_file("made.txt") == b"from command\n"
        assert sandbox.read_file("pkg/mod.py") == b"VALUE = 42\n"
        assert not (seed / "made.txt").exists(), "the sandbox must work on a copy of the workspace"

    def test_missing_file_and_directory_errors(self, sandbox):
        with pytest.raises(SandboxError, match="no such file"):
            sandbox.read_file("absent.txt")
        with pytest.raises(SandboxError, match="directory"):
            sandbox.read_file("pkg")

    def test_resource_usage_is_reported(self, sandbox):
        result = sandbox.exec(self.py("x = sum(i * i for i in range(3_000_000)); b = bytearray(20_000_000)"))
        assert result.ok and result.cpu_time_s > 0 and result.peak_memory_bytes >= 20_000_000

    def test_commands_of_one_turn_can_run_concurrently(self, sandbox):
        results: list[ExecResult | None] = [None] * 8

        def run(index: int) -> None:
            results[index] = sandbox.exec(f"echo {index} > f{index} && cat f{index}")

        threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [result.stdout.strip() for result in results] == [str(index) for index in range(8)]

    def test_many_concurrent_commands_leave_nothing_behind(self, sandbox):
        # More commands than the sandbox may have processes: anything a command leaves behind,
        # a zombie included, still counts against the limit and would make later forks fail.
        rounds = 2 * self.limits.max_processes // 8
        for _ in range(rounds):
            results: list[ExecResult | None] = [None] * 8

            def run(index: int, results=results) -> None:
                results[index] = sandbox.exec("echo ok")

            threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            failed = [result for result in results if result is None or result.stdout != "ok\n"]
            assert not failed, failed[0]
        if sandbox.uid is not None:
            leftovers = [line for line in Path("/proc").glob("[0-9]*/status")
                         if _uid_of(line) == sandbox.uid]
            assert not leftovers, f"processes (zombies included) of the sandbox's uid remain: {leftovers}"

    def test_closed_sandbox_refuses_work_and_close_is_idempotent(self, backend, seed):
        sandbox = backend.create(seed)
        sandbox.close()
        sandbox.close()
        with pytest.raises(SandboxError, match="closed"):
            sandbox.exec("true")

    # =========================================================================== hostile: network
    def test_hostile_outbound_tcp_connection_fails(self, backend, sandbox):
        self.requires(backend, "network-none")
        result = sandbox.exec(self.py("import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"))
        assert result.exit_status != 0 and ("unreachable" in result.stderr.lower() or "Errno" in result.stderr)

    def test_hostile_dns_resolution_fails(self, backend, sandbox):
        self.requires(backend, "network-none")
        result = sandbox.exec(self.py("import socket; print(socket.getaddrinfo('example.com', 443))"))
        assert result.exit_status != 0 and "gaierror" in result.stderr

    def test_hostile_udp_datagram_to_the_internet_fails(self, backend, sandbox):
        self.requires(backend, "network-none")
        result = sandbox.exec(self.py(
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53))"))
        assert result.exit_status != 0 and "unreachable" in result.stderr.lower()

    def test_hostile_host_loopback_service_is_unreachable(self, backend, sandbox):
        self.requires(backend, "network-none")
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        try:
            result = sandbox.exec(self.py(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"))
        finally:
            server.close()
        assert result.exit_status != 0
        assert "refused" in result.stderr.lower() or "unreachable" in result.stderr.lower(), result.stderr

    # =========================================================================== hostile: resources
    def test_hostile_fork_bomb_is_contained(self, backend, sandbox):
        self.requires(backend, "process-limit", "tree-kill")
        result = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout=8)
        assert "fork" in result.stderr and "retry" in result.stderr  # bash: fork: retry: Resource ...
        self.assert_no_strays(sandbox)
        assert sandbox.exec("echo still-usable").stdout == "still-usable\n"

    def test_hostile_python_fork_loop_is_contained(self, backend, sandbox):
        self.requires(backend, "process-limit", "tree-kill")
        result = sandbox.exec(self.py(
            "import os, time\n"
            "children = 0\n"
            "try:\n"
            "    while True:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60); os._exit(0)\n"
            "        children += 1\n"
            "except OSError as exc:\n"
            "    print('refused after', children, exc.errno)\n"), timeout=8)
        assert "refused after" in result.stdout
        assert int(result.stdout.split()[2]) < self.limits.max_processes
        self.assert_no_strays(sandbox)

    def test_hostile_memory_bomb_is_stopped(self, backend, sandbox):
        self.requires(backend, "memory-limit")
        result = sandbox.exec(self.py(
            "chunks = []\n"
            "while True:\n"
            "    chunks.append(bytearray(16 * 1024 * 1024))\n"), timeout=15)
        assert result.exit_status != 0 and not result.timed_out
        assert "MemoryError" in result.stderr or result.exit_status == 128 + signal.SIGKILL
        if result.exit_status == 128 + signal.SIGKILL:  # an OOM kill says so (on cgroup v1 too)
            assert result.killed_reason == "memory-limit", result

    def test_hostile_memory_bomb_in_child_processes_is_stopped(self, backend, sandbox):
        self.requires(backend, "memory-limit", "tree-kill")
        each = self.limits.memory_bytes // 3
        result = sandbox.exec(
            f"for i in 1 2 3 4 5; do {self.python} -c 'import time; b = bytearray({each}); time.sleep(30)' & done; wait",
            timeout=6)
        assert result.peak_memory_bytes <= self.limits.memory_bytes + 16 * MiB
        self.assert_no_strays(sandbox)

    def test_hostile_big_file_is_cut_at_the_file_size_limit(self, sandbox):
        result = sandbox.exec(f"head -c {4 * self.limits.max_file_bytes} /dev/zero > big; echo $?; stat -c %s big")
        size = int(result.stdout.split()[-1])
        assert size <= self.limits.max_file_bytes

    def test_hostile_many_files_hit_the_disk_quota(self, backend, sandbox):
        self.requires(backend, "disk-quota")
        chunk = self.limits.max_file_bytes // 2
        count = 4 * self.limits.disk_bytes // chunk
        result = sandbox.exec(f"for i in $(seq {count}); do head -c {chunk} /dev/zero > f$i || exit 9; done",
                              timeout=15)
        assert result.exit_status == 9 and "No space left" in result.stderr
        used = sum(path.stat().st_size for path in sandbox.workdir.glob("f*"))
        assert used <= self.limits.disk_bytes

    def test_hostile_tmp_fill_stays_private_and_bounded(self, backend, sandbox):
        self.requires(backend, "readonly-system")
        name = f"relayrl-fill-{sandbox.token}"
        result = sandbox.exec(f"for i in $(seq 64); do head -c 4194304 /dev/zero > /tmp/{name}-$i || exit 9; done",
                              timeout=15)
        assert result.exit_status == 9
        assert not list(Path("/tmp").glob(f"{name}*")), "the command wrote into the host's /tmp"

    def test_hostile_infinite_stdout_is_truncated_with_a_marker(self, sandbox):
        result = sandbox.exec("yes relayrl", timeout=10)
        assert result.truncated and result.killed_reason == "output-limit" and not result.timed_out
        head = result.stdout.split(TRUNCATION_MARKER.split("{")[0])[0]
        assert len(head.encode()) == self.limits.max_output_bytes and "more bytes not shown" in result.stdout

    def test_hostile_infinite_stderr_is_truncated(self, sandbox):
        result = sandbox.exec("yes relayrl >&2", timeout=10)
        assert result.truncated and "more bytes not shown" in result.stderr and result.stdout == ""

    def test_output_exactly_at_the_limit_is_complete(self, sandbox):
        result = sandbox.exec(f"head -c {self.limits.max_output_bytes} /dev/zero | tr '\\0' x")
        assert not result.truncated and len(result.stdout) == self.limits.max_output_bytes

    def test_hostile_cpu_spin_is_killed_by_the_cpu_limit(self, sandbox):
        result = sandbox.exec(self.py("while True: pass"), timeout=self.limits.wall_time_s)
        assert not result.timed_out, "RLIMIT_CPU, not the wall clock, must stop a spinning process"
        assert result.exit_status in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)

    def test_hostile_open_file_descriptors_are_bounded(self, sandbox):
        result = sandbox.exec(self.py(
            "import os\n"
            "fds = []\n"
            "try:\n"
            "    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n"
            "except OSError as exc:\n"
            "    print(len(fds), exc.errno)\n"))
        opened, errno = map(int, result.stdout.split())
        assert opened < self.limits.max_open_files and errno == 24  # EMFILE

    # =========================================================================== hostile: time and processes
    def test_hostile_sleep_past_the_timeout_is_killed(self, sandbox):
        result = sandbox.exec("sleep 600", timeout=1)
        assert result.timed_out and result.killed_reason == "timeout" and result.exit_status == 128 + signal.SIGKILL
        self.assert_no_strays(sandbox)

    def test_hostile_sigterm_ignoring_process_is_killed_at_the_timeout(self, sandbox):
        result = sandbox.exec("trap '' TERM INT HUP; while true; do sleep 1; done", timeout=1)
        assert result.timed_out
        self.assert_no_strays(sandbox)

    def test_hostile_orphaned_child_does_not_outlive_its_command(self, backend, sandbox):
        self.requires(backend, "tree-kill")
        result = sandbox.exec("(sleep 600 &) ; echo parent-exits")
        assert result.stdout == "parent-exits\n" and result.wall_time_s < self.limits.wall_time_s
        self.assert_no_strays(sandbox)

    def test_hostile_daemonised_child_does_not_outlive_its_command(self, backend, sandbox):
        self.requires(backend, "tree-kill")
        result = sandbox.exec(self.py(
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.closerange(0, 3)\n"
            "        time.sleep(600)\n"
            "    os._exit(0)\n"
            "print('detached')\n"))
        assert result.stdout == "detached\n"
        self.assert_no_strays(sandbox)

    def test_hostile_nohup_disowned_job_does_not_outlive_its_command(self, backend, sandbox):
        self.requires(backend, "tree-kill")
        sandbox.exec("nohup setsid sleep 600 > /dev/null 2>&1 & disown; echo gone")
        self.assert_no_strays(sandbox)

    def test_hostile_background_job_holding_stdout_does_not_hang_the_call(self, backend, sandbox):
        self.requires(backend, "tree-kill")
        result = sandbox.exec("sleep 600 & echo returned")
        assert result.stdout == "returned\n" and not result.timed_out
        self.assert_no_strays(sandbox)

    # =========================================================================== hostile: file system
    def test_hostile_symlink_to_a_host_file_is_not_followed_by_the_host(self, sandbox, tmp_path):
        secret = tmp_path / "host-secret.txt"
        secret.write_text("host secret")
        assert sandbox.exec(f"ln -s {secret} leak && ln -s /etc dir").ok
        with pytest.raises(SandboxError, match="symlink"):
            sandbox.read_file("leak")
        with pytest.raises(SandboxError, match="not a directory|symlink"):
            sandbox.read_file("dir/hostname")

    def test_hostile_symlink_is_not_followed_by_host_writes(self, sandbox, tmp_path):
        target = tmp_path / "host-file.txt"
        target.write_text("original")
        assert sandbox.exec(f"ln -s {target} trap && ln -s {tmp_path} trapdir").ok
        with pytest.raises(SandboxError):
            sandbox.write_file("trap", "overwritten")
        with pytest.raises(SandboxError):
            sandbox.write_file("trapdir/new.txt", "escaped")
        assert target.read_text() == "original" and not (tmp_path / "new.txt").exists()

    def test_hostile_dotdot_and_absolute_paths_are_refused(self, sandbox):
        for path in ("../outside.txt", "pkg/../../outside.txt", "/etc/passwd", ""):
            with pytest.raises(SandboxError):
                sandbox.read_file(path)
            with pytest.raises(SandboxError):
                sandbox.write_file(path or "", "x")
        assert not (sandbox.workdir.parent / "outside.txt").exists()

    def test_hostile_writes_outside_the_workspace_fail(self, backend, sandbox):
        self.requires(backend, "readonly-system", "unprivileged")
        canaries = [f"/etc/relayrl-{sandbox.token}", f"/root/relayrl-{sandbox.token}",
                    f"/var/lib/relayrl-{sandbox.token}", f"{sandbox.workdir.parent}/relayrl-{sandbox.token}",
                    f"/var/tmp/relayrl-{sandbox.token}", f"/dev/shm/relayrl-{sandbox.token}"]
        script = "; ".join(f"echo x > {path}" for path in canaries)
        sandbox.exec(script)
        assert [path for path in canaries if os.path.exists(path)] == []

    def test_hostile_reading_the_graders_files_fails(self, backend, sandbox):
        self.requires(backend, "unprivileged")
        with backend.create() as grader:
            grader.write_file("tests/test_hidden.py", "SECRET = 'the hidden tests'\n")
            path = Path(grader.workdir) / "tests" / "test_hidden.py"
            result = sandbox.exec(f"cat {path}; ls {grader.workdir}")
        assert "the hidden tests" not in result.stdout and result.exit_status != 0

    def test_hostile_reading_hidden_task_data_fails(self, backend, seed):
        self.requires(backend, "readonly-system")
        # World-readable and outside the private /tmp, like task data in site-packages.
        task = (Path("/var/lib") if os.geteuid() == 0 else Path.home()) / f"relayrl-task-{uuid.uuid4().hex}"
        (task / "hidden_tests").mkdir(parents=True)
        try:
            (task / "hidden_tests" / "test_secret.py").write_text("HIDDEN TEST\n")
            (task / "gold.patch").write_text("GOLD PATCH\n")
            task.chmod(0o755)
            with backend.create(seed, hide=[task / "hidden_tests", task / "gold.patch"]) as sandbox:
                result = sandbox.exec(f"cat {task}/hidden_tests/test_secret.py {task}/gold.patch; ls -R {task}")
        finally:
            shutil.rmtree(task)
        assert "HIDDEN TEST" not in result.stdout and "GOLD PATCH" not in result.stdout
        assert "test_secret.py" not in result.stdout

    @staticmethod
    @contextlib.contextmanager
    def _world_readable_host_directory() -> Iterator[Path]:
        """A world-readable directory outside the system directories holding ``SECRET`` (like another
        task's data, a project checkout or a cache)."""
        parent = Path("/srv") if os.geteuid() == 0 and Path("/srv").is_dir() else Path.home()
        directory = parent / f"relayrl-host-data-{uuid.uuid4().hex}"
        directory.mkdir()
        try:
            (directory / "SECRET").write_text("host data\n")
            directory.chmod(0o755)
            yield directory
        finally:
            shutil.rmtree(directory)

    def test_hostile_host_paths_outside_the_allowlist_do_not_exist(self, backend, sandbox):
        """Not hidden one by one: a sandbox's root holds the system directories, /dev, /proc, /tmp,
        /var/tmp and the way to its workspace, and nothing else of the host."""
        self.requires(backend, "readonly-system")
        from relayrl.sandbox.view import SYSTEM_PATHS, visible_paths, within

        checkout = Path(__file__).resolve().parents[1]  # relayrl's own source, wherever it is installed
        with self._world_readable_host_directory() as data:
            result = sandbox.exec(f"cat {data}/SECRET; ls {data} {checkout} {Path.home()} 2>&1; echo; ls -a /")
        assert "host data" not in result.stdout and "SECRET" not in result.stdout
        if not within(str(checkout), visible_paths([])):  # not installed into the system's own Python
            assert "grading_runner.py" not in result.stdout
        top = set(result.stdout.split("\n\n")[-1].split())
        allowed = {Path(path).name for path in SYSTEM_PATHS} | {".", "..", "dev", "proc", "tmp", "var",
                                                                 Path(sandbox.workdir).parts[1]}
        assert top and top <= allowed, f"the sandbox sees host paths outside the allowlist: {sorted(top - allowed)}"

    def test_exposed_host_paths_are_visible_read_only(self, backend, seed):
        self.requires(backend, "readonly-system")
        with self._world_readable_host_directory() as data:
            backend.expose([data])
            with backend.create(seed) as sandbox:
                result = sandbox.exec(f"cat {data}/SECRET; echo planted > {data}/note 2>&1; ls {data}")
            assert "host data" in result.stdout and not (data / "note").exists()

    def test_hostile_reading_root_only_host_files_fails(self, backend, sandbox):
        self.requires(backend, "unprivileged")
        result = sandbox.exec("cat /etc/shadow /root/.bash_history 2>&1; echo status=$?")
        assert "root:" not in result.stdout and "status=0" not in result.stdout

    def test_hostile_dev_shm_is_private(self, backend, sandbox):
        self.requires(backend, "readonly-system")
        sandbox.exec(f"echo x > /dev/shm/relayrl-{sandbox.token}")
        assert not os.path.exists(f"/dev/shm/relayrl-{sandbox.token}")

    # =========================================================================== hostile: privileges
    def test_hostile_signals_cannot_reach_the_host(self, backend, sandbox):
        self.requires(backend, "pid-isolation")
        victim = subprocess.Popen(["sleep", "600"])  # a host process the command knows the pid of
        try:
            sandbox.exec(f"kill -9 {victim.pid} {os.getpid()} 1 $PPID 2>&1; kill -9 -1 2>&1; echo after")
            assert victim.poll() is None, "a host process was killed from inside the sandbox"
        finally:
            victim.kill()
            victim.wait()

    def test_hostile_host_processes_are_invisible(self, backend, sandbox):
        self.requires(backend, "pid-isolation")
        result = sandbox.exec(f"test -e /proc/{os.getpid()}/environ && cat /proc/{os.getpid()}/cmdline; "
                              "ls /proc | grep -c '^[0-9]'")
        assert "pytest" not in result.stdout and int(result.stdout.split()[-1]) < 10

    def test_hostile_raising_resource_limits_fails(self, sandbox):
        result = sandbox.exec(self.py(
            "import resource\n"
            "for name in ('RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE'):\n"
            "    which = getattr(resource, name)\n"
            "    soft, hard = resource.getrlimit(which)\n"
            "    try:\n"
            "        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "        print(name, 'raised')\n"
            "    except (ValueError, OSError):\n"
            "        print(name, 'refused')\n"))
        assert "raised" not in result.stdout and result.stdout.count("refused") == 3

    def test_hostile_tampering_with_cgroup_limits_fails(self, backend, sandbox):
        self.requires(backend, "process-limit", "unprivileged")
        result = sandbox.exec("for f in $(find /sys/fs/cgroup -name pids.max -o -name memory.limit_in_bytes "
                              "-o -name memory.max 2>/dev/null); do echo max > $f 2>/dev/null && echo WROTE $f; done; true")
        assert "WROTE" not in result.stdout
        directories = getattr(getattr(sandbox.raw, "cgroup", None), "directories", [])
        for directory in directories:
            for name in ("pids.max",):
                if (Path(directory) / name).exists():
                    assert (Path(directory) / name).read_text().strip() == str(self.limits.max_processes)

    def test_hostile_becoming_root_fails(self, backend, sandbox):
        self.requires(backend, "unprivileged")
        result = sandbox.exec(self.py("import os\ntry:\n    os.setuid(0); print('root')\nexcept OSError:\n    print('refused')"))
        assert result.stdout == "refused\n"
        assert "uid=0(" not in sandbox.exec("su -c id root 2>&1; sudo -n id 2>&1; id").stdout

    def test_hostile_mounting_fails(self, backend, sandbox):
        self.requires(backend, "unprivileged", "readonly-system")
        result = sandbox.exec("mkdir -p m && mount -t tmpfs none m 2>&1; mount -o remount,rw / 2>&1; touch /etc/x-$$ 2>&1")
        assert "Read-only file system" in result.stdout or "Permission denied" in result.stdout
        assert not list(Path("/etc").glob("x-*"))

    def test_hostile_user_namespace_does_not_regain_write_access(self, backend, sandbox):
        self.requires(backend, "readonly-system")
        marker = f"/etc/relayrl-userns-{sandbox.token}"
        sandbox.exec(f"unshare --user --map-root-user --mount sh -c 'mount -o remount,rw / ; touch {marker}' 2>&1")
        assert not os.path.exists(marker)

    def test_hostile_ptrace_of_host_processes_fails(self, backend, sandbox):
        self.requires(backend, "pid-isolation")
        result = sandbox.exec(self.py(
            "import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"print(libc.ptrace(16, {os.getpid()}, 0, 0), ctypes.get_errno())\n"))  # PTRACE_ATTACH
        assert result.stdout.split()[0] == "-1"


    # =========================================================================== hostile: channels to others
    @staticmethod
    def host_directory() -> Path:
        """A directory outside /tmp (private in every sandbox) where this user may create files."""
        return Path("/var/lib") if os.access("/var/lib", os.W_OK) else Path.home()

    @staticmethod
    @contextlib.contextmanager
    def _host_mount(tmp_root: Path) -> Iterator[Path]:
        """A writable tmpfs mounted on the host below ``tmp_root`` (a submount of a read-only host)."""
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs on the host (the submount to attack) needs root")
        target = tmp_root / f"relayrl-submount-{uuid.uuid4().hex[:8]}"
        target.mkdir(mode=0o777)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(target)],
                          capture_output=True).returncode != 0:
            target.rmdir()
            pytest.skip("mounting a tmpfs on the host needs root")
        try:
            yield target
        finally:
            subprocess.run(["umount", "--lazy", str(target)], capture_output=True)
            target.rmdir()

    def test_hostile_writes_to_a_submount_of_the_host_fail(self, backend, seed):
        """Read-only means every mount: a writable submount (/run/lock, /dev/mqueue ...) is a channel
        between sandboxes, from a grader to later agents too."""
        self.requires(backend, "readonly-system")
        with self._host_mount(Path("/var/lib")) as target:
            with backend.create(seed) as raw:
                result = raw.exec(f"echo planted > {target}/note 2>&1; ls {target}")
            assert not (target / "note").exists(), result.stdout

    def test_hostile_sysv_ipc_does_not_outlive_the_sandbox(self, backend, seed):
        """A shared-memory segment made in one sandbox is invisible to the next and to the host."""
        self.requires(backend, "pid-isolation")
        if shutil.which("ipcmk") is None:
            pytest.skip("ipcmk (util-linux) is not installed")
        with backend.create(seed) as first:
            made = first.exec("ipcmk -M 4096 -p 0666 2>&1; ipcs -m")
            ids = [line.split()[1] for line in made.stdout.splitlines() if line.startswith("0x")]
        with backend.create(seed) as second:
            seen = second.exec("ipcs -m").stdout
        host = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
        for shmid in ids:
            assert f" {shmid} " not in seen and f" {shmid} " not in host, (made.stdout, seen)

    def test_hostile_host_unix_sockets_are_unreachable(self, backend, seed, tmp_path):
        """A world-writable unix socket on the host (and an abstract one) cannot be reached: a file
        system being read-only does not stop connect()."""
        self.requires(backend, "network-none", "readonly-system")
        directory = self.host_directory() / f"relayrl-socket-{uuid.uuid4().hex[:8]}"
        directory.mkdir(mode=0o755)
        path = directory / "service.sock"
        servers = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        abstract = f"\0relayrl-{uuid.uuid4().hex[:8]}"
        try:
            servers[0].bind(str(path))
            os.chmod(path, 0o777)
            servers[1].bind(abstract)
            for server in servers:
                server.listen(4)
            with backend.create(seed) as raw:
                result = raw.exec(self.py(
                    "import socket\n"
                    f"for address in ({str(path)!r}, {abstract!r}):\n"
                    "    client = socket.socket(socket.AF_UNIX)\n"
                    "    try:\n"
                    "        client.connect(address); print('connected')\n"
                    "    except OSError as exc:\n"
                    "        print('refused', exc.errno)\n"))
            assert "connected" not in result.stdout and result.stdout.count("refused") == 2, result
        finally:
            for server in servers:
                server.close()
            shutil.rmtree(directory, ignore_errors=True)

    @staticmethod
    def _create_use_close(backend, seed, failures: list[str], count: int) -> None:
        """Create, run a command in and close ``count`` sandboxes; append what failed to ``failures``."""
        for _ in range(count):
            try:
                with backend.create(seed) as raw:
                    result = raw.exec("echo ok")
                    if result.stdout != "ok\n":
                        raise SandboxError(f"unexpected output {result.output[:200]!r}")
            except SandboxError as exc:
                failures.append(str(exc)[:200])

    def test_creation_is_reliable(self, backend, seed):
        """1,000 sandboxes created, used and closed in a row: every one works (no ordering assumption
        about namespace ids, no leftover that makes the next one fail)."""
        failures: list[str] = []
        self._create_use_close(backend, seed, failures, 1000)
        assert not failures, f"{len(failures)} of 1000 creations failed: {sorted(set(failures))}"

    def test_concurrent_creation_and_closing_is_reliable(self, backend, seed):
        """Sandboxes created and closed from four threads at once, as a rollout fleet does: one
        sandbox's setup must not fail because another one's workspace disappears meanwhile."""
        failures: list[str] = []
        threads = [threading.Thread(target=self._create_use_close, args=(backend, seed, failures, 50))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, f"{len(failures)} of 200 concurrent creations failed: {sorted(set(failures))}"
