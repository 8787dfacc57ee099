"""The run lease: one launcher per run, on local files and on S3 (moto on loopback)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from relayrl.cli.run.lease import LeaseHeld, LeaseLost, RunLease, check_fence
from relayrl.core.errors import ObjectExists
from relayrl.core.processes import boot_id, start_time
from relayrl.core.store import open_store


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_store(str(tmp_path / "bus"))
    return open_store(request.getfixturevalue("s3_url"))


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_record(store, generation: int, **fields) -> None:
    record = {"owner": "x", "host": socket.gethostname(), "boot_id": boot_id(), "pid": 1, "pid_start": "",
              "started": 0.0, "heartbeat": 0.0, "beats": 0, "ttl_s": 60.0, "released": False, **fields}
    store.put(f"lease/{generation:010d}", json.dumps(record).encode())


def test_a_second_launcher_is_refused_in_one_line_naming_the_holder_until_the_first_releases(store):
    first = RunLease(store, where="run R")
    assert first.acquire() == 1
    with pytest.raises(LeaseHeld) as refused:
        RunLease(store, where="run R").acquire()
    message = str(refused.value)
    assert "\n" not in message and "run R is in use by launcher pid" in message and socket.gethostname() in message
    first.release()
    second = RunLease(store)
    assert second.acquire() == 2  # a released lease is free at once; generations only grow
    assert store.list("lease/") == ["lease/0000000002"]  # superseded generations are removed
    second.release()


def test_a_dead_launcher_on_this_host_frees_the_lease_at_once_and_a_reused_pid_does_not_hold_it(store):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_record(store, 1, pid=int(dead.stdout), heartbeat=1e12)  # a fresh heartbeat does not matter here
    lease = RunLease(store)
    assert lease.acquire() == 2
    lease.release()
    # Our own pid, but a different start time: the pid was reused by another process.
    write_record(store, 3, pid=os.getpid(), pid_start=str(int(start_time(os.getpid())) - 1))
    assert RunLease(store).acquire() == 4


def test_a_holder_on_another_host_expires_after_its_ttl_and_then_finds_itself_superseded(store):
    clock = Clock()
    lost: list[str] = []
    remote = RunLease(store, ttl_s=30, clock=clock, on_lost=lost.append)
    remote._mine = lambda: {**RunLease._mine(remote), "host": "elsewhere"}  # its records name another host
    assert remote.acquire() == 1
    clock.now += 20
    assert remote.beat()  # heartbeats while alive
    clock.now += 29
    with pytest.raises(LeaseHeld, match="host elsewhere.*29 s ago.*expires 30 s after its last heartbeat"):
        RunLease(store, ttl_s=30, clock=clock).acquire()
    clock.now += 2  # 31 s without a heartbeat: taken for dead
    successor = RunLease(store, ttl_s=30, clock=clock)
    assert successor.acquire() == 2
    # The old holder was only paused: its next heartbeat sees generation 2 and gives up; its children are fenced.
    assert not remote.beat() and lost and "generation 2 > 1" in lost[0]
    with pytest.raises(LeaseLost, match="generation 2 > 1"):
        check_fence(store, 1)
    check_fence(store, 2)  # the successor's processes go on
    remote.release()  # a lost lease is not marked released: the successor keeps it
    with pytest.raises(LeaseHeld):
        RunLease(store, ttl_s=30, clock=clock).acquire()
    successor.release()


def test_unreadable_or_foreign_lease_objects_do_not_wedge_the_run(store):
    store.put("lease/0000000001", b"\xff not json")
    store.put("lease/notes", b"someone's file")
    lease = RunLease(store)
    assert lease.acquire() == 2
    lease.release()


def test_racing_launchers_one_wins(store):
    winners, refused = [], []

    def contend() -> None:
        try:
            winners.append(RunLease(store).acquire())
        except LeaseHeld as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert winners == [1] and len(refused) == 5


def test_a_conditional_create_that_landed_but_reported_an_error_is_still_ours(tmp_path):
    class Ambiguous:
        """Lands the create, then reports that the object exists (as a retried request would)."""

        def __init__(self, inner):
            self.inner, self.url = inner, inner.url

        def put(self, key, data, *, if_absent=False):
            self.inner.put(key, data, if_absent=if_absent)
            if if_absent:
                raise ObjectExists(f"object {key} already exists (conditional create)")

        def __getattr__(self, name):
            return getattr(self.inner, name)

    inner = open_store(str(tmp_path / "bus"))
    lease = RunLease(Ambiguous(inner))
    assert lease.acquire() == 1
    with pytest.raises(LeaseHeld):
        RunLease(inner).acquire()


def test_the_heartbeat_thread_keeps_a_remote_lease_fresh(tmp_path):
    store = open_store(str(tmp_path / "bus"))
    with RunLease(store, ttl_s=0.3) as lease:
        deadline = threading.Event()
        deadline.wait(0.5)
        record = json.loads(store.get("lease/0000000001"))
        assert record["beats"] >= 2 and lease.generation == 1
    assert json.loads(store.get("lease/0000000001"))["released"]

