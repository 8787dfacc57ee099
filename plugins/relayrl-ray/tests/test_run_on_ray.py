"""``relayrl run --launcher ray``: the quickstart across the nodes of a real Ray cluster, with the
trainer, the engine and the rollout manager each pinned to its own node, and its chaos: an engine's
actor killed, the rollout manager's actor killed, a trainer rank's actor killed, and a whole node
removed. The run must finish and its ledger audit must be clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from relayrl.cli.report import load_events
from relayrl.cli.run.ledger import verify_run
from relayrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]


def launch(cluster, run_dir: Path, steps: int, *extra: str) -> subprocess.Popen[str]:
    roles = ('{ trainer = { num_cpus = 1, resources = { trainer = 1 } }, engine = { num_cpus = 1, resources = '
             '{ engine = 1 } }, rollout = { num_cpus = 1, resources = { rollout = 1 } } }')
    argv = [sys.executable, "-m", "relayrl.cli", "run", str(ROOT / "examples/quickstart.toml"), "--run-dir",
            str(run_dir), "--steps", str(steps), "--no-report", "--launcher", "ray",
            "--set", f"launcher.options.address={json.dumps(cluster.address)}",
            "--set", f"launcher.options.roles={roles}", "--set", "trainer.warmup.steps=3",
            "--set", "buffer.batch_groups=2", "--set", "rollout.max_restarts=3",
            # Three warm-up steps leave most groups all-wrong: train on them anyway (the path is the point).
            "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
            "--set", "rollout.environment_options.tasks=500", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def finish(run: subprocess.Popen[str], run_dir: Path, timeout_s: float = 600) -> str:
    try:
        output, _ = run.communicate(timeout=timeout_s)
    finally:
        if run.poll() is None:
            run.kill()
    logs = "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}" for path in sorted((run_dir / "logs").glob("*.log")))
    assert run.returncode == 0, output[-3000:] + logs
    return output


def launcher_view(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status" / "launcher.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for_steps(run: subprocess.Popen[str], run_dir: Path, steps: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while len(read_metrics(run_dir)) < steps:
        assert run.poll() is None, run.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def actor_pid(process_pid: int) -> int:
    """The Ray worker (the actor) a role's process is a child of."""
    return int(Path(f"/proc/{process_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_quickstart_runs_across_nodes_with_each_role_on_its_own(cluster, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(cluster, run_dir, 4)
    nodes: dict[str, str] = {}
    while run.poll() is None and len(nodes) < 3:
        nodes = launcher_view(run_dir).get("nodes", {})
        time.sleep(0.2)
    output = finish(run, run_dir)
    assert "launcher: ray at" in output and "3 nodes" in output
    expected = {role: cluster.nodes_by_label[role].node_id[:12] for role in ("trainer", "engine", "rollout")}
    assert {name: node.split()[-1] for name, node in nodes.items()} == {
        "trainer": expected["trainer"], "engine-0": expected["engine"], "rollout": expected["rollout"]}
    assert [record["step"] for record in read_metrics(run_dir)] == [1, 2, 3, 4]
    assert verify_run(run_dir).ok


def test_killed_actors_and_a_lost_node_are_recovered_and_the_audit_is_clean(cluster, tmp_path):
    # A second engine-labelled node: when the first is removed, the engine has somewhere to go. And a
    # second trainer-labelled one: the two trainer ranks are spread over two nodes (STRICT_SPREAD).
    spare = cluster.add_node(num_cpus=2, resources={"engine": 1})
    cluster.add_node(num_cpus=2, resources={"trainer": 1})
    cluster.wait_for_nodes()
    run_dir = tmp_path / "run"
    run = launch(cluster, run_dir, 14, "--set", "trainer.ranks=2",
                 "--set", 'launcher.options.trainer_strategy="STRICT_SPREAD"')
    try:
        for step, victim in ((2, "engine-0"), (4, "rollout"), (6, "trainer-1")):
            wait_for_steps(run, run_dir, step)
            nodes = launcher_view(run_dir)["nodes"]
            assert nodes["trainer"].split()[-1] != nodes["trainer-1"].split()[-1], nodes
            os.kill(actor_pid(launcher_view(run_dir)["children"][victim]), signal.SIGKILL)
        wait_for_steps(run, run_dir, 8)
        engine_node = launcher_view(run_dir)["nodes"]["engine-0"].split()[-1]
        gone = next(node for node in [cluster.nodes_by_label["engine"], spare] if node.node_id[:12] == engine_node)
        cluster.remove_node(gone)
        # The engine comes back on the other engine-labelled node.
        deadline = time.monotonic() + 300
        while launcher_view(run_dir).get("nodes", {}).get("engine-0", engine_node).split()[-1] == engine_node:
            assert run.poll() is None and time.monotonic() < deadline, "the engine never moved"
            time.sleep(0.2)
        output = finish(run, run_dir, 900)
    finally:
        if run.poll() is None:
            run.kill()
    events = load_events(run_dir)
    print("\n".join(f"{event.kind}: {event.message}" for event in events if event.kind in ("restart", "engine-moved")))
    restarts = [event.data["process"] for event in events if event.kind == "restart"]
    assert restarts.count("engine-0") == 2 and "rollout" in restarts and "trainer" in restarts, (restarts, output[-2000:])
    assert [record["step"] for record in read_metrics(run_dir)] == list(range(1, 15))
    report = verify_run(run_dir)
    assert report.ok, report


def test_stop_resume_and_one_launcher_per_run_hold_on_ray(cluster, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(cluster, run_dir, 30)  # far more steps than pass before the stop lands
    try:
        wait_for_steps(run, run_dir, 2)
        # A second launcher of the same run is refused while the first holds the run's lease.
        second = subprocess.run([sys.executable, "-m", "relayrl.cli", "run", "--resume", str(run_dir), "--launcher",
                                 "ray", "--set", f"launcher.options.address={json.dumps(cluster.address)}"],
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and "one launcher per run" in second.stderr, second
        run.send_signal(signal.SIGINT)  # Ctrl-C: the fleet stops, the trainer checkpoints, exit 130
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 130 and "relayrl run --resume" in output, output[-2000:]
    finally:
        if run.poll() is None:
            run.kill()
    stopped_at = len(read_metrics(run_dir))
    assert 2 <= stopped_at < 30
    resumed = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", "--resume", str(run_dir), "--no-report",
                                "--launcher", "ray", "--set", f"launcher.options.address={json.dumps(cluster.address)}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finish(resumed, run_dir)
    assert [record["step"] for record in read_metrics(run_dir)] == list(range(1, 31))
    assert any(event.kind == "resumed" for event in load_events(run_dir))
    assert verify_run(run_dir).ok
