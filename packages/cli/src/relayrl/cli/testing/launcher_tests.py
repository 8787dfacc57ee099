"""``LauncherTests``: the conformance suite for launchers (``local`` built in, ``ray`` as a plugin).

The contract is :class:`relayrl.cli.hookspecs.LauncherBackend` and what it returns (``Slot``,
``RoleProcess``): a launcher places processes and reports on them; ``relayrl run``'s supervision
(restarts, resume, elastic ranks) is built on exactly these answers, so each is checked with real
processes: the READY handshake, exit statuses and signals as the supervisor reads them, the
environment a process gets, logs, a process that ignores SIGTERM, a replacement placed under the same
name, and trainer ranks that meet at rank 0.

Subclass it and override the ``launcher`` fixture: a backend for a run of ``world`` trainer ranks
(``LauncherTests.world``) whose processes write into ``run_dir``, closed after the test::

    class TestMyLauncher(LauncherTests):
        @pytest.fixture
        def launcher(self, run_dir):
            backend = MyBackend.create(options=None, world=self.world, run_dir=run_dir)
            yield backend
            backend.close()
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relayrl.cli.hookspecs import ROLES, LauncherBackend, RoleProcess

__all__ = ["LauncherTests", "alive", "eventually"]

# A server as relayrl's are: it binds the port its slot offers, then says READY on standard output.
SERVER = ("import socket, sys, time\n"
          "host, port = sys.argv[1], int(sys.argv[2])\n"
          "server = socket.socket(); server.bind((host, port)); server.listen()\n"
          "print('starting', flush=True)\n"
          "print('READY', server.getsockname()[1], flush=True)\n"
          "time.sleep(120)\n")


def eventually(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "the condition") -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} never happened within {timeout_s} s"
        time.sleep(0.05)


class LauncherTests:
    """Subclass and override the ``launcher`` fixture (see the module docstring)."""

    world = 2
    """The trainer ranks of the run the ``launcher`` fixture is made for."""

    @pytest.fixture
    def run_dir(self, tmp_path: Path) -> Path:
        return tmp_path

    @pytest.fixture
    def launcher(self, run_dir: Path) -> Iterator[LauncherBackend]:
        raise NotImplementedError("override the `launcher` fixture")

    @staticmethod
    def _finish(process: RoleProcess) -> int | None:
        process.terminate()
        process.wait(10)
        return process.poll()

    def test_describe_is_one_line(self, launcher):
        line = launcher.describe()
        assert isinstance(line, str) and line.strip() and "\n" not in line.strip()

    def test_a_server_binds_its_slots_port_and_its_ready_line_comes_back(self, launcher, run_dir):
        slot = launcher.place("engine", "engine-0")
        assert isinstance(slot.host, str) and slot.host
        port = slot.free_port()
        assert isinstance(port, int) and 0 < port < 65536
        process = slot.start("engine-0", ["-c", SERVER, slot.host, str(port)], run_dir / "engine-0.log", {},
                             capture_stdout=True)
        try:
            assert process.name == "engine-0" and process.log_path == run_dir / "engine-0.log"
            assert process.read_ready(60) == port
            assert process.poll() is None and isinstance(process.pid, int) and process.node
            # Lines before READY go to the log; the READY line is the launcher's own.
            eventually(lambda: "starting" in process.log_path.read_text(), what="stdout before READY in the log")
            assert "READY" not in process.log_path.read_text()
        finally:
            status = self._finish(process)
        assert status == -signal.SIGTERM, f"terminate() must read as SIGTERM, got {status}"

    def test_exit_status_stderr_and_environment_reach_the_launcher(self, launcher, run_dir, monkeypatch):
        # The launcher's RELAYRL_ variables travel with the process (a run's settings), next to its own env.
        monkeypatch.setenv("RELAYRL_CONFORMANCE", "forwarded")
        slot = launcher.place("rollout", "rollout")
        code = ("import os, sys; print(os.environ['RELAYRL_CONFORMANCE'], os.environ['MINE']); "
                "print('to stderr', file=sys.stderr); sys.exit(3)")
        process = slot.start("rollout", ["-c", code], run_dir / "rollout.log", {"MINE": "set"})
        assert process.env.get("MINE") == "set"
        eventually(lambda: process.poll() is not None, what="the exit")
        assert process.poll() == 3
        process.wait(10)
        assert process.log_path.read_text().split() == ["forwarded", "set", "to", "stderr"]

    def test_a_process_killed_by_a_signal_reads_as_killed_by_it(self, launcher, run_dir):
        slot = launcher.place("engine", "engine-0")
        code = "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)"
        process = slot.start("engine-0", ["-c", code], run_dir / "engine-0.log", {})
        eventually(lambda: process.poll() is not None, what="the kill")
        assert process.poll() == -signal.SIGKILL
        process.wait(10)

    def test_wait_kills_a_process_that_ignores_sigterm(self, launcher, run_dir):
        slot = launcher.place("rollout", "rollout")
        code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('READY 1', flush=True); time.sleep(300)")
        process = slot.start("rollout", ["-c", code], run_dir / "rollout.log", {}, capture_stdout=True)
        process.read_ready(60)  # SIGTERM is ignored from here on
        pid = process.pid
        process.terminate()
        time.sleep(0.3)
        assert process.poll() is None, "a process that ignores SIGTERM is still running"
        process.wait(1.0)
        assert process.poll() is not None and process.pid is None
        if pid is not None and Path(f"/proc/{pid}").exists():  # same machine: the process is gone too
            eventually(lambda: not alive(pid), what="the process's end")

    def test_a_replacement_is_placed_under_the_same_name(self, launcher, run_dir):
        """What a restart does: the dead process's name is placed and started again."""
        for attempt in range(2):
            slot = launcher.place("engine", "engine-0")
            code = f"print('attempt {attempt}')"
            process = slot.start("engine-0", ["-c", code], run_dir / "engine-0.log", {})
            eventually(lambda process=process: process.poll() is not None, what="the exit")
            assert process.poll() == 0
            process.wait(10)
        assert (run_dir / "engine-0.log").read_text().split() == ["attempt", "0", "attempt", "1"]

    def test_every_role_can_be_placed(self, launcher, run_dir):
        for role in ROLES:
            if role == "trainer":
                continue  # ranks: the gang-scheduled test below
            name = "engine-0" if role == "engine" else role
            slot = launcher.place(role, name)
            process = slot.start(name, ["-c", "print('placed')"], run_dir / f"{name}.log", {})
            eventually(lambda process=process: process.poll() is not None, what=f"{name}'s exit")
            assert process.poll() == 0, f"{role}: {process.log_path.read_text()[-500:]}"
            process.wait(10)

    def test_trainer_ranks_are_placed_together_and_meet_at_rank_zero(self, launcher, run_dir):
        from relayrl.cli.run.launcher import TrainerRanks

        code = ("import os; print(*(os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', "
                "'MASTER_PORT')))")
        group = TrainerRanks(["-c", code], run_dir, self.world, env={}, backend=launcher)
        group.start()
        eventually(lambda: group.poll() is not None, what="the ranks' exit")
        assert group.poll() == 0
        group.wait(10)
        lines = [(run_dir / ("trainer.log" if rank == 0 else f"trainer-{rank}.log")).read_text().split()
                 for rank in range(self.world)]
        assert [line[0] for line in lines] == [str(rank) for rank in range(self.world)]
        assert {line[2] for line in lines} == {str(self.world)}
        assert len({tuple(line[3:]) for line in lines}) == 1, "every rank meets at the same address and port"
        assert int(lines[0][4]) > 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
