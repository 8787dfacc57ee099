"""Elastic ranks (relayrl.trainer.elastic) on real gloo groups, in processes of their own.

The leader must never wait on a member that is gone: gloo does not always notice (a send to a peer
that was SIGKILLed at the wrong moment, or that is alive but will never take part, waits for gloo's
timeout, minutes), so the leader polls its operation and checks the other members while it waits.
Here trainer-1 joins, takes the leader's state and then ignores the group; the leader's broadcast
must end within seconds once trainer-1 has announced itself again (it left the group) or once its
process has died, instead of after gloo's timeout.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

MEMBER = Path(__file__).with_name("elastic_member.py")


def _start(root: Path, role: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, str(MEMBER), str(root), role], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    process.lines = queue.Queue()  # type: ignore[attr-defined]  # read on a thread: a wait can time out
    threading.Thread(target=lambda: [process.lines.put(line) for line in process.stdout], daemon=True).start()
    return process


def _line(process: subprocess.Popen[str], prefix: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        try:
            line = process.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith(prefix):
            return line.strip()
        seen.append(line)
    raise AssertionError(f"no {prefix!r} line from the {process.args[-1]} within {timeout_s} s: {''.join(seen)[-2000:]}")


@pytest.mark.parametrize("how", ["announces itself again", "dies"])
def test_the_leaders_wait_ends_when_a_member_leaves_even_though_gloo_would_wait(tmp_path, how):
    leader, follower = _start(tmp_path, "leader"), _start(tmp_path, "follower")
    try:
        assert _line(follower, "JOINED") == "JOINED 7"  # the leader's state reached the newcomer
        assert _line(leader, "FORMED") == "FORMED 2"
        time.sleep(2.0)  # the leader now waits in a broadcast trainer-1 never receives
        announcement = tmp_path / "elastic" / "members" / "trainer-1.json"
        if how == "dies":
            # Stopped first, so that its sockets stay open (as gloo sees a peer that vanished
            # mid-operation); the announcement then names a process that no longer exists.
            os.kill(follower.pid, signal.SIGSTOP)
            record = json.loads(announcement.read_text())
            record["identity"]["pid_start"] = "0"  # the same pid, another process: provably not it
            announcement.write_text(json.dumps(record))
        else:
            record = json.loads(announcement.read_text())
            announcement.write_text(json.dumps({**record, "ticket": record["ticket"] + 1}))
        ended = _line(leader, "ENDED", timeout_s=30).split(" ", 2)
        assert float(ended[1]) < 10.0, ended  # seconds, not gloo's three minutes
        expected = "has died" if how == "dies" else "left the group"
        assert f"trainer-1 (pid {follower.pid}) {expected}" in ended[2], ended
    finally:
        for process in (leader, follower):
            process.kill()
            process.wait()
