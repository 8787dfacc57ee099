"""The launcher's child-process handling: the READY handshake of engine servers, trainer ranks."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from relayrl.cli.run.launcher import Child, RunFailed, TrainerRanks
from relayrl.cli.run.local_backend import LocalBackend

NOISY = ("import sys, time; print('INFO engine core starting'); print('INFO loading weights'); "
         "print('READY 4321', flush=True); print('INFO serving', flush=True); time.sleep(30)")


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
