"""``relayrl run`` with three elastic torch ranks (``[trainer] elastic``), ranks SIGKILLed at random moments.

Each kill must shrink the group while rank 0 trains on (no full restart: the leader's process and
the run's checkpoints continue, nothing is resumed), the launcher restarts the dead rank alone, and
it is admitted back at a step boundary with the leader's state. The first kill is injected
(``RELAYRL_FAULT_KILL``): trainer-2 dies after it has received step 6, while the others are in the
step's collectives, so they must redo that step on the same batch. The test then waits for the group
to be whole again before each next kill, so every kill hits a group of three; those come at seeded
random moments after a step (mid-step, mid-broadcast or between steps, whichever they land on). At
the end the ledger audit must be clean: no group trained twice, none lost.
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
from relayrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("RELAYRL_ELASTIC_SEED", "0"))
INJECTED = ("trainer-2", 6)  # dies in step 6
VICTIMS = ["trainer-1", "trainer-2", "trainer-1"]  # then these, one at a time
ARGS = ["--steps", "400", "--no-report", "--set", "trainer.warmup.steps=3",
        "--set", "rollout.environment_options.tasks=500", "--set", "buffer.batch_groups=2",
        "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
        "--set", "trainer.ranks=3", "--set", "trainer.elastic=true"]


def _world_sizes(run_dir: Path) -> list[float]:
    return [record["metrics"]["elastic/world_size"] for record in read_metrics(run_dir)]


def _children(run_dir: Path) -> dict[str, int]:
    return json.loads((run_dir / "status" / "launcher.json").read_text())["children"]


def test_elastic_torch_ranks_shrink_and_regrow_while_the_leader_trains_on(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED} (replay with RELAYRL_ELASTIC_SEED={SEED})")
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", RELAYRL_FAULT_KILL=f"{INJECTED[0]}-in-step:{INJECTED[1]}")
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"),
                            "--run-dir", str(run_dir), *ARGS],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    kills: list[tuple[int, str, float]] = []
    leader_pid = None
    try:
        deadline = time.monotonic() + 900
        victims = list(VICTIMS)
        while run.poll() is None and time.monotonic() < deadline:
            sizes = _world_sizes(run_dir) if (run_dir / "metrics.jsonl").exists() else []
            # Kill only after the injected one, once the group is whole (three ranks trained the last two steps).
            if victims and len(sizes) > INJECTED[1] + 2 and sizes[-2:] == [3.0, 3.0]:
                leader_pid = leader_pid or _children(run_dir)["trainer"]
                time.sleep(rng.uniform(0.0, 0.6))  # a random moment in the next step(s)
                victim = victims.pop(0)
                pid = _children(run_dir)[victim]
                os.kill(pid, signal.SIGKILL)
                kills.append((len(_world_sizes(run_dir)), victim, time.monotonic()))
                print(f"killed {victim} (pid {pid}) after step {kills[-1][0]}")
                # Wait until a step shows the group shrunk; the next kill waits for it to be whole again.
                while (run.poll() is None and time.monotonic() < deadline
                       and min(_world_sizes(run_dir)[kills[-1][0]:] or [3.0]) == 3.0):
                    time.sleep(0.1)
            if not victims and len(sizes) >= 2 and sizes[-2:] == [3.0, 3.0] and len(sizes) > kills[-1][0] + 2:
                break  # regrown after the last kill: stop the run as a user would
            time.sleep(0.1)
        assert run.poll() is None, "the run ended before the test was done"
        assert _children(run_dir)["trainer"] == leader_pid, "the leader was restarted: not elastic"
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    logs = "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted((run_dir / "logs").glob("*.log")))
    assert run.returncode == 130, output[-3000:] + logs  # stopped by the user, after the checkpoint of its step
    assert [victim for _, victim, _ in kills] == VICTIMS, output[-3000:] + logs

    sizes = _world_sizes(run_dir)
    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, len(records) + 1))
    # The injected death: step 6 failed in a group of three and was redone by the two survivors.
    injected = records[INJECTED[1] - 1]["metrics"]
    assert sizes[INJECTED[1] - 2] == 3.0 and injected["elastic/redone"] >= 1 and injected["elastic/world_size"] == 2.0, \
        (sizes, injected)
    kills.insert(0, (INJECTED[1] - 1, INJECTED[0], 0.0))
    for step, victim, _ in kills:  # each kill: the group shrank, then grew back to three
        after = sizes[step:]
        assert min(after) < 3.0, (victim, step, sizes)
        assert 3.0 in after[after.index(min(after)):], (victim, step, sizes)

    events = load_events(run_dir)
    restarts = [event for event in events if event.kind == "restart"]
    assert [event.data["process"] for event in restarts] == [INJECTED[0], *VICTIMS], [e.message for e in restarts]
    assert all(event.data.get("elastic") for event in restarts)
    assert not any(event.kind == "resumed" for event in events), "a full restart resumed from a checkpoint"
    elastic = [event for event in events if event.kind == "elastic"]
    assert sum(event.data["change"] == "shrank" for event in elastic) == len(kills), [e.message for e in elastic]
    assert sum(event.data["change"] == "grew" for event in elastic) >= len(kills) + 1  # the start, then each return
    redone = sum(record["metrics"]["elastic/redone"] for record in records)
    print(f"world sizes {sizes}; steps redone after a failed collective: {redone:.0f}")

    check = verify_run(run_dir)
    assert check.ok, "\n".join(check.errors)
    assert check.final_step == len(records) and check.trained == 2 * len(records)
