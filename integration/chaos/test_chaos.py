"""Chaos: the quickstart while its trainer ranks, engine and rollout manager are SIGKILLed, then an audit.

The trainer runs as two elastic torch ranks (``[trainer] elastic``). The run must reach its last
step (the launcher restarts whatever dies: the leader's death restarts both ranks, which resume from
the newest checkpoint; the other rank's death shrinks the group and it rejoins; the engine
bootstraps its weights from the bus, the rollout manager continues its segment sequence); last the launcher itself is SIGKILLed and ``--resume`` takes the run over at
once while a second launcher is refused; and, read back from the bus, the ledger and the final checkpoint, every committed
group the trainer consumed was trained on exactly once or dropped by a policy with its reason
(relayrl.cli.run.ledger.verify_run).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from relayrl.cli.report import load_events
from relayrl.cli.run.ledger import verify_run
from relayrl.core.store import open_store
from relayrl.sandbox.local import default_root
from relayrl.sandbox.reaper import reap_stale
from relayrl.trainer.metrics import read_metrics
from relayrl.weight_sync import WeightBus

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
# Short and fast: a tiny warm-up cannot solve anything, so zero-variance groups are trained on
# (zero advantage) instead of skipped; a small staleness bound makes the buffer drop groups too.
SHORT = ["--set", "trainer.warmup.steps=5", "--set", "rollout.environment_options.tasks=2000",
         "--set", "buffer.batch_groups=4", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']", "--set", "buffer.staleness.max_staleness=1",
         "--set", "rollout.max_restarts=20", "--set", "trainer.ranks=2", "--set", "trainer.elastic=true"]
# Which process dies when the trainer has completed how many steps (each victim at least once).
KILLS = [(4, "trainer"), (8, "engine-0"), (10, "trainer-1"), (11, "rollout"), (14, "trainer")]
# Before these kills, damage on disk: the snapshot the engine must bootstrap from (the trainer
# republishes a fresh one when the engine asks), and the trainer's newest checkpoint (it resumes
# from the one before).
CORRUPT = {8: "weights", 14: "checkpoint"}
LAUNCHER_KILL_AT = 17
SEED = 11


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for offset in (len(data) // 3, len(data) // 2):
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def corrupt(run_dir: Path, what: str) -> str:
    if what == "weights":
        bus = WeightBus(open_store(str(run_dir)))
        snapshot = bus.read_manifest(bus.newest_version(), cached=False).snapshot
        for key in {entry.object_key for entry in bus.read_manifest(snapshot, cached=False).tensors}:
            flip_bytes(run_dir / key)
        return f"snapshot {snapshot}"
    newest = sorted(run_dir.glob("checkpoints/step-*/rank-00000.commit"))[-1].with_suffix(".pt")
    flip_bytes(newest)
    return str(newest.relative_to(run_dir))


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_quickstart_under_random_kills_consumes_every_group_exactly_once(tmp_path):
    run_dir = tmp_path / "run"
    rng = random.Random(SEED)
    print(f"chaos seed {SEED}; kills at steps {KILLS}, damage at {CORRUPT}, launcher at {LAUNCHER_KILL_AT}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                            "--run-dir", str(run_dir), "--steps", str(STEPS), "--no-report", *SHORT],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killed = []
    try:
        deadline = time.monotonic() + 1500
        pending = list(KILLS)
        while pending and run.poll() is None and time.monotonic() < deadline:
            at, victim = pending[0]
            records = read_metrics(run_dir)
            # The second rank dies once it trains in the group (restarted with rank 0 at the first
            # trainer kill, it may not have been admitted again yet): its death must shrink the group.
            in_group = victim != "trainer-1" or (records and records[-1]["metrics"].get("elastic/world_size") == 2.0)
            if len(records) >= at and in_group:
                time.sleep(rng.uniform(0.0, 0.6))  # anywhere in the step: mid-forward, mid-checkpoint-write ...
                children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
                if victim in children:
                    if at in CORRUPT:
                        print(f"step {at}: corrupted {corrupt(run_dir, CORRUPT[at])}, killing {victim}")
                    os.kill(children[victim], signal.SIGKILL)
                    killed.append(victim)
                    print(f"step {len(read_metrics(run_dir))}: SIGKILL {victim} (pid {children[victim]})", flush=True)
                    pending.pop(0)
            time.sleep(0.2)
        # Last, the launcher itself (its children die with it); --resume takes its lease over at once.
        while len(read_metrics(run_dir)) < LAUNCHER_KILL_AT and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(rng.uniform(0.0, 0.6))
        orphans = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
        run.kill()
        output, _ = run.communicate(timeout=60)
        resumed = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", "--resume", str(run_dir), "--no-report"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        run = resumed
        # A second launcher on the same run (a scheduler's retry) is refused in one line and changes nothing.
        bus = open_store(str(run_dir))
        while run.poll() is None and json.loads(bus.get(bus.list("lease/")[-1]))["pid"] != resumed.pid:
            time.sleep(0.2)
        second = subprocess.run([sys.executable, "-m", "relayrl.cli", "run", "--resume", str(run_dir)],
                                capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"is in use by launcher pid {resumed.pid}" in second.stderr and len(second.stderr.splitlines()) == 1
        output, _ = run.communicate(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output[-5000:]
    assert not [name for name, pid in orphans.items() if alive(pid)]  # they died with their launcher
    assert sorted(set(killed)) == ["engine-0", "rollout", "trainer", "trainer-1"] and len(killed) == len(KILLS), killed

    # The engine could not verify the damaged snapshot, asked for a repair and got a fresh one.
    assert "asked the publisher for a fresh snapshot" in (run_dir / "logs" / "engine-0.log").read_text()
    restarts = [event for event in load_events(run_dir) if event.kind == "restart"]
    assert len(restarts) == len(killed)
    # The second rank's death restarted it alone: the leader trained on in a smaller group.
    assert [event.data.get("elastic", False) for event in restarts] == [victim == "trainer-1" for victim in killed]
    assert any(event.kind == "elastic" and event.data["change"] == "shrank" for event in load_events(run_dir))
    assert [record["step"] for record in read_metrics(run_dir)] == list(range(1, STEPS + 1))

    check = verify_run(run_dir)
    print(f"committed {check.committed}, trained {check.trained}, dropped {check.dropped}, pending {check.pending}")
    # Nothing left behind: no process of this run, no sandbox of a dead owner.
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and str(run_dir) in _command_line(int(pid))]
    assert reap_stale(Path(default_root())) == [], "a killed process's sandboxes were never reaped"
    assert check.ok, "\n".join(check.errors)
    assert check.final_step == STEPS and check.trained >= STEPS * 4
