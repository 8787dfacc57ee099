"""The launcher's child-process handling: the READY handshake of engine servers."""

from __future__ import annotations

import sys
import time

import pytest

from relayrl.cli.run.launcher import Child, RunFailed

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
