"""Process identities: a dead, reused, zombie or rebooted-away process is provably dead."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.core.processes import boot_id, identity, is_dead

pytestmark = pytest.mark.skipif(not boot_id(), reason="needs Linux /proc and a kernel boot id")


def test_a_live_process_is_not_dead_and_a_finished_one_is():
    assert is_dead(identity()) is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = identity(child.pid)
    child.wait()
    assert is_dead(record) is True


def test_a_zombie_is_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = identity(child.pid)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert is_dead(record) is True  # exited, not yet reaped by its parent
    child.wait()


def test_a_reused_pid_a_reboot_and_another_host():
    me = identity()
    assert is_dead({**me, "pid_start": str(int(me["pid_start"]) + 1)}) is True  # another process, same pid
    assert is_dead({**me, "boot_id": "00000000-0000-0000-0000-000000000000"}) is True  # before a reboot
    assert is_dead({**me, "host": "elsewhere"}) is None  # cannot tell from here
    assert is_dead({**me, "boot_id": ""}) is None
