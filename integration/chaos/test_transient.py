"""Chaos, transient: faults that come and go during one quickstart run, then an audit.

Real faults, not fakes: the bus lives in a directory of its own, made read-only for a few seconds (a
store outage: every write fails, as an unreachable object store's would); the run directory is a
small tmpfs, filled to the last byte and freed again (a full disk); an engine and the trainer are
SIGSTOPped (hung: they neither die nor answer); one engine dies more times than the old lifetime
restart budget allowed, each death further apart than the restart window; the rollout process is
killed. The run must reach its last step on its own, and ``verify_run`` must find every group the
trainer consumed trained exactly once or dropped with a reason.

Mounting needs root (CI runs as root); elsewhere the test skips and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.cli.report import load_events
from relayrl.cli.run.ledger import verify_run
from relayrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
STEPS = 45
RESTART_WINDOW_S = 10
LIVENESS_TIMEOUT_S = 10
SHORT = ["--set", "trainer.warmup.steps=5", "--set", "rollout.environment_options.tasks=2000",
         "--set", "buffer.batch_groups=4", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']", "--set", "rollout.max_restarts=2",
         "--set", f"rollout.restart_window_s={RESTART_WINDOW_S}",
         "--set", f"rollout.liveness_timeout_s={LIVENESS_TIMEOUT_S}"]
# (the trainer step at which it starts, the fault). Progress between two faults shows the run healed.
FAULTS = [(3, "kill engine-0"), (7, "store outage"), (11, "stop engine-0"), (15, "kill engine-0"),
          (19, "disk full"), (23, "stop trainer"), (27, "kill rollout")]
OUTAGE_S = 5
DISK_FULL_S = 20


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def children(run_dir: Path) -> dict[str, int]:
    try:
        return json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
    except (OSError, ValueError, KeyError):
        return {}


def live_pid(run_dir: Path, name: str, timeout_s: float = 60.0) -> int:
    """The pid of the run's process ``name`` once the launcher lists it alive (it may be restarting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = children(run_dir).get(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)
                return pid
        time.sleep(0.2)
    raise AssertionError(f"{name} is not running: {children(run_dir)}")


def fill(path: Path) -> None:
    """Write zeros into ``path`` until the file system refuses (ENOSPC)."""
    with open(path, "wb") as handle:
        block = b"\0" * (1 << 20)
        with contextlib.suppress(OSError):
            while True:
                handle.write(block)
                handle.flush()


@pytest.fixture
def mounts(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the faults are a tmpfs filled to the last byte and a read-only bind mount")
    run_dir, bus = tmp_path / "run", tmp_path / "bus"
    run_dir.mkdir()
    bus.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=400m", "tmpfs", str(run_dir))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {getattr(exc, 'stderr', exc)}")
    yield run_dir, bus
    unmount(bus)
    unmount(run_dir)


def test_the_quickstart_survives_faults_that_come_and_go(mounts):
    run_dir, bus = mounts
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                            "--run-dir", str(run_dir / "quickstart"), "--steps", str(STEPS), "--no-report",
                            "--set", f"store.url={json.dumps(str(bus))}", *SHORT],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run_dir = run_dir / "quickstart"
    done: list[str] = []
    engine_restarted_at = 0.0
    try:
        deadline = time.monotonic() + 1200
        for at, fault in FAULTS:
            while len(read_metrics(run_dir)) < at and run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if run.poll() is not None or time.monotonic() > deadline:
                break
            if "engine-0" in fault:  # each engine death further from the last than the restart window
                time.sleep(max(0.0, engine_restarted_at + RESTART_WINDOW_S + 1 - time.monotonic()))
            victim = fault.split()[-1]
            if fault == "store outage":
                mount("--bind", "-o", "ro", str(bus), str(bus))
                time.sleep(OUTAGE_S)
                unmount(bus)
            elif fault == "disk full":
                filler = run_dir.parent / "filler"
                fill(filler)
                time.sleep(DISK_FULL_S)
                filler.unlink()
            else:
                os.kill(live_pid(run_dir, victim), signal.SIGSTOP if fault.startswith("stop") else signal.SIGKILL)
            if "engine-0" in fault:
                engine_restarted_at = time.monotonic()
            done.append(fault)
            print(f"step {len(read_metrics(run_dir))}: {fault}", flush=True)
        output, _ = run.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if run.poll() is None:
            run.kill()
            output, _ = run.communicate()
        for event in load_events(run_dir):
            if event.level != "info" or event.kind in ("restart", "hung"):
                print(f"{event.source} {event.kind}: {event.message[:200]}")
                print("".join(f"    {line}\n" for line in event.data.get("log_tail", [])[-3:]), end="")
    assert done == [fault for _, fault in FAULTS], output[-5000:]
    assert run.returncode == 0, output[-5000:]

    events = load_events(run_dir)
    restarts = [event for event in events if event.kind == "restart"]
    restarted = [event.data["process"] for event in restarts]
    # engine-0 died three times (killed, hung, killed): more than max_restarts = 2, never within the window.
    assert restarted.count("engine-0") >= 3 and "trainer" in restarted and "rollout" in restarted, restarted
    # The store outage and the full disk cost no process its life beyond one restart per victim: the
    # bookkeeping writes they refused are retried, and a process the disk killed waits for room.
    # Every death is one of the faults' (SIGKILL, or the liveness check's after a SIGSTOP) or the disk's.
    deaths = [(event.data["process"], event.message) for event in restarts if event.data["exit"] != -signal.SIGKILL]
    assert all("the disk is full" in message for _, message in deaths), deaths
    assert len(deaths) == len({process for process, _ in deaths}), deaths  # one restart each: it waited for room
    hung = {event.data["process"] for event in events if event.kind == "hung"}
    assert {"engine-0", "trainer"} <= hung, [(event.kind, event.message) for event in events]
    assert [record["step"] for record in read_metrics(run_dir)][-1] == STEPS

    check = verify_run(run_dir)
    print(f"committed {check.committed}, trained {check.trained}, dropped {check.dropped}, pending {check.pending}; "
          f"events: {[(event.kind, event.message[:80]) for event in events if event.level != 'info']}")
    assert check.ok, "\n".join(check.errors)
    assert check.final_step == STEPS
