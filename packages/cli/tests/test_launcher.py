"""The launcher's child-process handling: the READY handshake of engine servers, trainer ranks."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from relayrl.cli.run.launcher import Child, RunFailed, TrainerRanks
from relayrl.cli.run.local_backend import LocalBackend, LocalSlot
from relayrl.cli.testing import LauncherTests

ROOT = Path(__file__).resolve().parents[3]

NOISY = ("import sys, time; print('INFO engine core starting'); print('INFO loading weights'); "
         "print('READY 4321', flush=True); print('INFO serving', flush=True); time.sleep(30)")


class TestLocalLauncher(LauncherTests):
    """The built-in ``local`` launcher passes the launcher conformance suite."""

    @pytest.fixture
    def launcher(self, run_dir):
        backend = LocalBackend.create(options=None, world=self.world, run_dir=run_dir)
        yield backend
        backend.close()


def test_read_ready_skips_library_logging_on_stdout_and_keeps_it_in_the_log(tmp_path):
    child = Child("engine-0", [sys.executable, "-c", NOISY], tmp_path / "engine-0.log")
    child.start(capture_stdout=True)
    try:
        assert child.read_ready(30) == 4321
        deadline = time.monotonic() + 10
        while "INFO serving" not in (tmp_path / "engine-0.log").read_text():
            assert time.monotonic() < deadline, "lines after READY never reached the log"
            time.sleep(0.05)
        log = (tmp_path / "engine-0.log").read_text()
        assert "engine core starting" in log and "READY" not in log
    finally:
        child.terminate()
        child.wait(10)


def test_read_ready_reports_a_child_that_exits_first(tmp_path):
    child = Child("engine-1", [sys.executable, "-c", "print('no luck'); raise SystemExit(3)"], tmp_path / "e.log")
    child.start(capture_stdout=True)
    with pytest.raises(RunFailed, match="exited with 3"):
        child.read_ready(30)


# A stand-in trainer rank: prints its environment; rank 0 stops on SIGTERM like the leader, telling
# the follower through a file (the real leader broadcasts "stop"); rank 1 exits with FOLLOWER_EXIT
# after a moment when that is set, else once told to stop.
RANK = """
import os, pathlib, signal, sys, time
rank, stop = int(os.environ["RANK"]), pathlib.Path(sys.argv[1])
print(os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], flush=True)
if rank == 0:
    def on_term(*_):
        stop.write_text("stop")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    time.sleep(60)
    sys.exit(1)
if "FOLLOWER_EXIT" in os.environ:
    time.sleep(0.5)
    sys.exit(int(os.environ["FOLLOWER_EXIT"]))
while not stop.exists():
    time.sleep(0.05)
"""


def wait_for_status(group: TrainerRanks, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while (status := group.poll()) is None:
        assert time.monotonic() < deadline, "the group never ended"
        time.sleep(0.05)
    return status


def test_trainer_ranks_die_together(tmp_path):
    group = TrainerRanks(["-c", RANK, str(tmp_path / "stop")], tmp_path, 2,
                         env={"FOLLOWER_EXIT": "3"}, backend=LocalBackend())
    group.start()
    assert set(group.pids()) == {"trainer", "trainer-1"}
    # One rank fails: the group reports its status and kills the leader (it would block in a collective).
    assert wait_for_status(group) == 3 and group.failed == "trainer-1"
    assert group.ranks[0].poll() == -signal.SIGKILL
    assert group.poll() == 3 and group.failed == "trainer-1"  # asked again: still the rank that failed
    group.wait(0)
    lines = [(tmp_path / name).read_text().split() for name in ("trainer.log", "trainer-1.log")]
    assert [line[:2] for line in lines] == [["0", "2"], ["1", "2"]] and lines[0][2:] == lines[1][2:]


def test_trainer_ranks_stop_through_the_leader(tmp_path):
    env: dict[str, str] = {}
    group = TrainerRanks(["-c", RANK, str(tmp_path / "stop")], tmp_path, 2, env=env, backend=LocalBackend())
    group.start()
    time.sleep(0.5)
    assert group.poll() is None
    group.terminate()  # SIGTERM to the leader only: the follower must end because the leader told it to
    assert wait_for_status(group) == 0
    assert [child.poll() for child in group.ranks] == [0, 0]
    group.wait(10)


def test_elastic_trainer_ranks_restart_a_follower_alone_and_end_with_the_leader(tmp_path):
    restarts: list[tuple[str, int, int, bool]] = []
    group = TrainerRanks(["-c", RANK, str(tmp_path / "stop")], tmp_path, 3,
                         env={"FOLLOWER_EXIT": "3"}, backend=LocalBackend(), elastic=True, max_restarts=2,
                         on_rank_restart=lambda name, status, count, tail, restarted:
                         restarts.append((name, status, count, restarted)))
    group.start()
    leader = group.ranks[0].process.pid
    deadline = time.monotonic() + 30
    # Both followers exit with 3 every time: each is restarted alone twice, then left out.
    while len(restarts) < 6:
        assert group.poll() is None, "a follower's exit ended the elastic group"
        assert time.monotonic() < deadline, restarts
        time.sleep(0.05)
    assert sorted(restarts) == sorted((name, 3, count, restarted) for name in ("trainer-1", "trainer-2")
                                      for count, restarted in ((1, True), (2, True), (2, False)))
    assert group.ranks[0].process.pid == leader and group.ranks[0].poll() is None
    assert set(group.pids()) == {"trainer"}  # the given-up followers are not restarted again
    time.sleep(1.0)
    assert group.poll() is None and len(restarts) == 6
    group.terminate()  # the leader's exit ends the group
    assert wait_for_status(group) == 0
    group.wait(10)


def test_elastic_trainer_ranks_report_the_leaders_failure(tmp_path):
    env: dict[str, str] = {}
    group = TrainerRanks(["-c", RANK, str(tmp_path / "stop")], tmp_path, 2, env=env, backend=LocalBackend(),
                         elastic=True)
    group.start()
    time.sleep(0.5)
    os.kill(group.ranks[0].process.pid, signal.SIGKILL)
    assert wait_for_status(group) == -signal.SIGKILL and group.failed == "trainer"
    assert group.ranks[1].poll() is not None  # the follower was stopped with it (a full restart follows)


class MovingBackend(LocalBackend):
    """The local launcher, except that an engine placed again comes back at another address of this
    machine (``localhost`` instead of ``127.0.0.1``): what a cluster does when it puts a restarted
    engine on another node."""

    def __init__(self) -> None:
        super().__init__()
        self.engine_places = 0

    def place(self, role: str, name: str, *, rank: int | None = None) -> LocalSlot:
        slot = super().place(role, name, rank=rank)
        if role == "engine":
            self.engine_places += 1
            if self.engine_places > 1:
                slot.host = "localhost"
        return slot


def test_an_engine_back_at_another_address_restarts_the_rollout_process_with_it(tmp_path):
    from relayrl.cli.report import load_events
    from relayrl.cli.run.launcher import Launcher
    from relayrl.cli.run.layout import RunLayout
    from relayrl.cli.run.ledger import verify_run
    from relayrl.core.config import load_config
    from relayrl.core.plugins import get_plugin_manager
    from relayrl.trainer.metrics import read_metrics

    overrides = ["trainer.steps=6", "trainer.warmup.steps=3", "rollout.environment_options.tasks=500",
                 "buffer.batch_groups=2", "rollout.skip_zero_variance=false", "buffer.admission=['staleness']"]
    config = load_config(ROOT / "examples" / "quickstart.toml", overrides=overrides, pm=get_plugin_manager())
    layout = RunLayout(tmp_path / "run")
    layout.create(config.raw)
    launcher = Launcher(layout, config, backend=MovingBackend())
    outcome: dict[str, int] = {}
    supervisor = threading.Thread(target=lambda: outcome.update(status=launcher.run()))
    supervisor.start()
    try:
        deadline = time.monotonic() + 300
        while len(read_metrics(layout.root)) < 2:
            assert supervisor.is_alive() and time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.2)
        os.kill(launcher.engines[0].pid, signal.SIGKILL)
        supervisor.join(600)
    finally:
        if supervisor.is_alive():
            launcher.stop()
            supervisor.join(120)
    assert outcome.get("status") == 0
    moved = [event for event in load_events(layout.root) if event.kind == "engine-moved"]
    assert len(moved) == 1 and moved[0].data["engines"][0].startswith("http://localhost:")
    assert launcher.engine_urls == moved[0].data["engines"]
    assert [record["step"] for record in read_metrics(layout.root)] == list(range(1, 7))
    assert verify_run(layout.root).ok
