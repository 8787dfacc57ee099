"""``relayrl run`` end to end: the quickstart pipeline, short, with an engine killed, Ctrl-C, and --resume.

This is the CI version of the quickstart (examples/quickstart.toml with a few steps): it asserts
that the whole pipeline ran (engines applied weight updates, staleness was recorded, answers were
graded in the sandbox, checkpoints resumed the run), never how fast or how well it learned.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.cli.report import load_events
from relayrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart.toml"
# A few warm-up steps leave the model unable to solve anything, so every group would have zero
# variance and be skipped: train on them anyway (zero advantages), the pipeline is what is tested.
SHORT = ["--set", "trainer.warmup.steps=5", "--set", "rollout.environment_options.tasks=2000",
         "--set", "buffer.batch_groups=4", "--set", "rollout.skip_zero_variance=false",
         "--set", "buffer.admission=['staleness']"]


def relayrl(*args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "relayrl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **kwargs)


def wait_for(condition, timeout_s: float, what: str, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            pytest.fail(f"relayrl run exited ({process.returncode}) while waiting for {what}:\n{process.stdout.read()}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_bad_config_fails_before_anything_starts(tmp_path):
    run = relayrl("run", str(QUICKSTART), "--run-dir", str(tmp_path / "run"), "--set", "rollout.enviroment='countdown'")
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 2
    assert "rollout.enviroment: unknown key; did you mean environment" in output
    assert not (tmp_path / "run").exists()


def rollout_engines(run_dir):
    """The engines' health in the rollout manager's newest status ([{}], not ready, before the first one)."""
    try:
        return json.loads((run_dir / "status" / "rollout.json").read_text())["engines"] or [{}]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return [{}]


def test_quickstart_pipeline_survives_an_engine_kill_then_stops_on_ctrl_c_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    stage = (tmp_path / "stage").as_uri()
    # The run's [weight_sync] must reach its engines: XOR applies without verification, read from a
    # node mirror the launcher fills (stage_url), none of them the defaults.
    weight_sync = ["--set", "weight_sync.apply_mode='xor'", "--set", "weight_sync.verify_after_apply=false",
                   "--set", f"weight_sync.stage_url='{stage}'"]
    run = relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--steps", "12", *SHORT, *weight_sync)
    try:
        wait_for(lambda: len(read_metrics(run_dir)) >= 3, 400, "three trainer steps", run)
        children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
        os.kill(children["engine-0"], signal.SIGKILL)
        wait_for(lambda: any(event.kind == "restart" for event in load_events(run_dir)), 120, "the engine restart", run)
        steps_at_restart = len(read_metrics(run_dir))
        wait_for(lambda: len(read_metrics(run_dir)) >= steps_at_restart + 2, 300, "steps after the restart", run)
        # The status is a snapshot taken once a second: wait for one in which the restarted engine
        # answered its health check (a snapshot taken while it was down has no weight_sync entry).
        wait_for(lambda: all("weight_sync" in engine for engine in rollout_engines(run_dir)), 60,
                 "the restarted engine's health", run)
        engines = rollout_engines(run_dir)
        run.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()  # its children get SIGTERM from the kernel (they die with the launcher)
    assert run.returncode == 130, output
    assert f"relayrl run --resume {run_dir}" in output
    # The restarted engine, too, applies versions as the run's [weight_sync] says, from the mirror.
    assert "mirror" in children
    assert [engine["weight_sync"]["settings"] for engine in engines] == [
        {"source": stage, "prefix": "weights", "apply_mode": "xor", "verify_after_apply": False,
         "reset_caches_on_apply": True, "poll_interval_s": 0.1}], engines
    assert not any(alive(pid) for pid in children.values())
    stopped_at = len(read_metrics(run_dir))
    assert 5 <= stopped_at < 12
    # The newest checkpoint is damaged while the run is stopped (no peer holds a copy): the resume
    # falls back to the one before and says so.
    newest = sorted(commit.with_suffix(".pt") for commit in (run_dir / "checkpoints").glob("step-*/rank-00000.commit"))[-1]
    damaged_step = int(newest.parent.name.removeprefix("step-"))
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))

    resumed = relayrl("run", "--resume", str(run_dir))
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output

    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, 13))
    events = load_events(run_dir)
    kinds = [event.kind for event in events]
    assert "warmup" in kinds and "restart" in kinds and kinds.count("resumed") == 1
    resumed_event = next(event for event in events if event.kind == "resumed")
    assert stopped_at - 2 <= resumed_event.data["step"] < damaged_step  # the one before the damaged one
    discarded = [event for event in events if event.kind == "checkpoint" and event.level == "warning"]
    assert discarded and damaged_step in discarded[0].data["discarded"], [event.message for event in events]
    assert "failed verification" in output  # printed by the display
    last = records[-1]["metrics"]
    # Engines applied the trainer's weight updates in place (read from their /health every second).
    assert max(record["metrics"].get("fleet/engine_weight_updates", 0) for record in records) >= 2
    assert max(record["metrics"].get("fleet/engine_version_min", 0) for record in records) >= 2
    # Staleness was measured (the fleet runs ahead of the trainer) and answers were graded in the sandbox.
    assert any(name.startswith("staleness/hist/") for record in records for name in record["metrics"])
    # The rollout process's sandbox counters count from its own start: the resumed run's last steps may
    # train on groups committed before the stop while its fresh rollout process has graded nothing yet,
    # so the check is that some step saw answers graded, not the last one.
    graded = [record["metrics"] for record in records if "sandbox/calls" in record["metrics"]]
    assert graded and max(metrics["sandbox/calls"] for metrics in graded) > 0
    assert max(metrics["sandbox/graded_answers"] for metrics in graded) > 0
    assert 0.0 <= last["reward/fleet_mean"] <= 1.0 and last["entropy/token_mean"] > 0
    # Deltas, not full copies. (Not necessarily the last step's report: a resumed trainer first publishes a
    # full snapshot, and when it resumes one step before the end, that may be the last publish to finish.)
    assert max(record["metrics"].get("weight_sync/delta_ratio", 0) for record in records) > 1
    report = run_dir / "report"
    assert (report / "report.html").exists() and len(list(report.glob("*.png"))) >= 4


def test_a_colocated_run_is_one_process_that_survives_a_sigkill_and_trains_every_group_exactly_once(tmp_path):
    """``[rollout] colocate``: the launcher starts the trainer alone, which samples with an engine on its
    own parameters (the engine follows every step without a weight delta) and grades in the sandbox.
    SIGKILLed mid-run, it is restarted, resumes from its checkpoint, and the ledger checks out."""
    from relayrl.cli.run.ledger import verify_run

    run_dir = tmp_path / "run"
    # The bus gets weights only every 4 steps (the engine follows every step in memory).
    run = relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--steps", "10", "--no-report", *SHORT,
                  "--set", "rollout.colocate=true", "--set", "weight_sync.publish_every_steps=4")
    try:
        wait_for(lambda: len(read_metrics(run_dir)) >= 3, 400, "three trainer steps", run)
        children = json.loads((run_dir / "status" / "launcher.json").read_text())["children"]
        os.kill(children["trainer"], signal.SIGKILL)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output
    assert list(children) == ["trainer"], children  # no engine server, no rollout process
    kinds = [event.kind for event in load_events(run_dir)]
    assert "restart" in kinds and "resumed" in kinds, kinds
    records = read_metrics(run_dir)
    assert [record["step"] for record in records][-1] == 10
    # The engine sampled with the trainer's versions as they were made, every step: the tokens on the bus
    # record versions the bus never received (it got 1, then those after steps 4 and 8, and the last).
    from relayrl.core import codec, wire
    from relayrl.core.store import open_store

    bus = open_store(str(run_dir))
    versions = {version for key in bus.list("rollouts/")
                for group in codec.decode_compressed(bus.get(key), wire.RolloutSegment, what=key).groups
                for trajectory in group.trajectories for version in trajectory.policy_version_range()}
    assert len(versions - {1, 5, 9, 11}) >= 3, versions
    assert any(name.startswith("staleness/hist/") for record in records for name in record["metrics"])
    assert max(record["metrics"].get("sandbox/graded_answers", 0) for record in records) > 0
    check = verify_run(run_dir)
    assert check.errors == [] and check.trained > 0, check


def interrupt_in_phase(run: subprocess.Popen, run_dir: Path, phase: str, settle_s: float = 0.0) -> str:
    """Ctrl-C ``run`` once its trainer reports ``phase``; check it exits 130 with the trainer's own
    "stopped" status (a trainer the launcher had to kill writes nothing); return its output."""
    status = run_dir / "status" / "trainer.json"
    try:
        wait_for(lambda: status.exists() and json.loads(status.read_text()).get("phase") == phase, 300,
                 f"the trainer's {phase} phase", run)
        time.sleep(settle_s)
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, output
    assert json.loads(status.read_text())["phase"] == "stopped", output
    return output


def test_ctrl_c_during_the_warm_up_stops_the_trainer_at_once_not_after_it(tmp_path):
    """A warm-up can take minutes; the trainer must not finish it (or be killed by the launcher's
    timeout) before it stops. It says where it stopped, and a resume would start the warm-up again."""
    run_dir = tmp_path / "run"
    run = relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--no-report",
                  "--set", "trainer.warmup.steps=1000000")  # far longer than any test would wait
    output = interrupt_in_phase(run, run_dir, "warmup")
    stopped = [event for event in load_events(run_dir) if event.source == "trainer" and event.kind == "stopped"]
    assert stopped and "stopped during the supervised warm-up, at step" in stopped[0].message, output
    assert "warmup" not in [event.kind for event in load_events(run_dir)]


def test_ctrl_c_while_the_demonstrations_are_played_stops_the_trainer_at_once(tmp_path):
    """Demonstrations graded one by one (the kernels example's 300 take minutes) are cancelled by a
    stop, not played to the end (or cut short by the launcher's kill, which leaves no word)."""
    from relayrl.environments.kernels.grading import KernelGrader

    reason = KernelGrader().check()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    run = relayrl("run", str(ROOT / "examples" / "kernels.toml"), "--run-dir", str(run_dir), "--no-report",
                  "--set", "rollout.environment_options.demonstrations=5000")  # an hour of gradings
    output = interrupt_in_phase(run, run_dir, "demonstrations", settle_s=3)  # gradings in flight
    stopped = [event for event in load_events(run_dir) if event.source == "trainer" and event.kind == "stopped"]
    assert stopped and "stopped while the warm-up's demonstrations were played" in stopped[0].message, output


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory) -> Path:
    """examples/agent.toml, short: a warm-up on the experts alone long enough for well-formed calls
    (the example's careless players teach answering without tools), a context limit low enough
    that most trajectories compact."""
    run_dir = tmp_path_factory.mktemp("agent") / "run"
    run = relayrl("run", str(ROOT / "examples" / "agent.toml"), "--run-dir", str(run_dir), "--steps", "3",
                  "--set", "trainer.warmup.steps=40", "--set", "rollout.environment_options.demonstrations=64",
                  "--set", "rollout.environment_options.demonstration_styles={parallel=1.0, sequential=1.0}",
                  "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
                  "--set", "buffer.batch_groups=2", "--set", "rollout.harness_options.context_limit=150")
    output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output
    return run_dir


def test_the_agentic_example_uses_tools_in_sandboxes_compacts_and_trains_every_segment(agent_run, tmp_path):
    """Checks that the agentic path ran, not that it learned."""
    from relayrl.cli.run.ledger import verify_run

    records = read_metrics(agent_run)
    assert [record["step"] for record in records] == [1, 2, 3]
    fleet = [record["metrics"] for record in records if "fleet/tool_calls_per_trajectory" in record["metrics"]]
    assert fleet, "no step saw graded trajectories"
    assert max(metrics["fleet/tool_calls_per_trajectory"] for metrics in fleet) >= 1  # tools were called ...
    assert max(metrics["fleet/tool_s_per_call"] for metrics in fleet) > 0  # ... ran in sandboxes, and were timed
    assert max(metrics["fleet/turns_per_trajectory"] for metrics in fleet) > 1  # multi-turn
    assert max(metrics["fleet/compacted_share"] for metrics in fleet) > 0  # some trajectories compacted ...
    assert max(record["metrics"]["response/segments_mean"] for record in records) > 1  # ... and were trained on
    assert all(0.0 <= metrics["reward/fleet_graded_mean"] <= 1.0 for metrics in fleet)
    rollout = json.loads((agent_run / "status" / "rollout.json").read_text())
    assert rollout["metrics"]["sandbox/graded_answers"] > 0  # answers graded by the sandboxed script
    check = verify_run(agent_run)
    assert check.ok, check
    assert_a_vanished_pending_segment_is_reported(agent_run, tmp_path)
    report = agent_run / "report"
    assert "trajectories.html" in (report / "report.html").read_text()  # the report links the viewer
    tools = (report / "report.md").read_text().split("## Tools called (share of committed trajectories)", 1)
    assert len(tools) == 2 and "| versions | trajectories | grep |" in tools[1]  # which tools, from the bus


def test_the_kernels_example_grades_every_submission_in_a_sandbox_and_trains(tmp_path):
    """examples/kernels.toml, short: checks that the path ran (demonstrations through the real grader,
    submissions graded in sandboxes with their feedback in the context, rewards from the grader,
    groups trained, the ledger clean), not that it learned."""
    from relayrl.cli.run.ledger import verify_run
    from relayrl.environments.kernels.grading import KernelGrader

    reason = KernelGrader().check()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    run = relayrl("run", str(ROOT / "examples" / "kernels.toml"), "--run-dir", str(run_dir), "--steps", "3",
                  "--set", "trainer.warmup.steps=20", "--set", "rollout.environment_options.demonstrations=12",
                  "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
                  "--set", "buffer.batch_groups=1")
    output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output
    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == [1, 2, 3]
    fleet = [record["metrics"] for record in records if "fleet/tool_calls_per_trajectory" in record["metrics"]]
    assert fleet and max(metrics["fleet/turns_per_trajectory"] for metrics in fleet) > 1
    assert all(0.0 <= metrics["reward/fleet_graded_mean"] <= 2.0 for metrics in fleet)  # max_speedup = 2
    rollout = json.loads((run_dir / "status" / "rollout.json").read_text())["metrics"]
    assert rollout["kernels/graded"] > 0 and rollout["kernels/gradings"] > 0  # answers graded in sandboxes
    # Submissions and final answers share reports: never more gradings than the two together.
    assert rollout["kernels/gradings"] <= rollout["kernels/submissions"] + rollout["kernels/graded"]
    warmup = [event for event in load_events(run_dir) if event.kind == "warmup"]
    assert warmup and "supervised warm-up: 20 steps" in warmup[0].message
    check = verify_run(run_dir)
    assert check.ok, check


def assert_a_vanished_pending_segment_is_reported(run_dir: Path, tmp_path: Path) -> None:
    """On a copy of the run: a segment not yet trained that disappears from the bus (renumbered one up,
    as if lost and its number taken by the producer's next one) is a gap ``verify_run`` reports."""
    import shutil

    from relayrl.buffer.cursor import BufferState, Cursor
    from relayrl.buffer.segments import parse_segment_key, segment_key
    from relayrl.cli.run.layout import RunLayout
    from relayrl.cli.run.ledger import verify_run
    from relayrl.fault_tolerance.checkpoint import CheckpointStore
    from relayrl.fault_tolerance.recovery import recover

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report"))
    layout = RunLayout(copy)
    config = layout.load_config()
    bus, prefix = layout.bus(config), config.buffer.prefix
    cursor = Cursor.from_state(BufferState.coerce(recover(CheckpointStore(layout.checkpoint_store())).state["buffer"]))
    newest: dict[str, int] = {}
    for key in bus.list(f"{prefix.strip('/')}/"):
        if (parsed := parse_segment_key(prefix, key)) is not None:
            newest[parsed[0]] = max(newest.get(parsed[0], -1), parsed[1])
    pending = [(producer, sequence) for producer, sequence in newest.items()
               if not cursor.segment_done(producer, sequence)]
    if not pending:
        print("every segment was trained: no pending segment to lose")
        return
    producer, sequence = pending[0]
    bus.put(segment_key(prefix, producer, sequence + 1), bus.get(segment_key(prefix, producer, sequence)))
    bus.delete(segment_key(prefix, producer, sequence))
    check = verify_run(copy)
    assert not check.ok and any(f"producer {producer}: 1 segment(s) missing" in error for error in check.errors), check


BUGFIX_CONFIG = """
[run]
name = "bugfix"

[model]
tokenizer = "char"
chat_format = "raw"
init = { hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 512, max_position_embeddings = 1024 }

[rollout]
environment = "code"
harness = "coding-agent"
harness_options = { system_prompt = "", max_turns = 4, max_tokens_per_turn = 400, max_total_tokens = 600, context_limit = 1024, summary_max_tokens = 16, compaction_prompt = "compact:", summary_header = "summary:", show_tool_time = false }
engines = 1
max_batch = 64
group_size = 4
max_concurrent_groups = 4
max_ahead_groups = 4
skip_zero_variance = false

[algo]
optimizer = { lr = 5e-4, muon = true }

[trainer]
steps = 4
threads = 1
warmup = { steps = 60, batch_size = 12, lr = 5e-3, muon = true, muon_lr = 0.02, decay = "cosine", threads = 2 }

[buffer]
batch_groups = 2
admission = ["staleness"]
"""
"""The ``code`` environment (the shipped bug-fix tasks) with a fresh model warmed up on the gold-patch
expert's demonstrations of those same tasks: enough for well-formed calls, which is all this tests."""


def test_the_code_environment_runs_bug_fix_tasks_with_a_real_model_tools_in_sandboxes_and_the_isolated_grader(
        tmp_path):
    """The path, not the score: a model served by the torch engine calls tools in sandboxes, its
    diffs are graded by hidden tests in the isolated grader, groups are trained, weights applied."""
    from relayrl.cli.run.ledger import verify_run
    from relayrl.cli.view import collect_groups

    config = tmp_path / "bugfix.toml"
    config.write_text(BUGFIX_CONFIG)
    run_dir = tmp_path / "run"
    run = relayrl("run", str(config), "--run-dir", str(run_dir), "--no-report")
    output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output
    assert "supervised warm-up: 60 steps" in output
    assert [record["step"] for record in read_metrics(run_dir)] == [1, 2, 3, 4]
    trained = [entry["group"] for entry in collect_groups(run_dir) if entry["outcome"] == "trained"]
    assert len(trained) == 8  # four steps of two groups
    trajectories = [trajectory for group in trained for trajectory in group.trajectories]
    calls = [(call, result) for trajectory in trajectories for segment in trajectory.segments
             for turn in segment.turns for call, result in zip(turn.tool_calls, _results_after(segment.turns, turn))]
    assert calls, "no tool call was made"
    ran = [result for _, result in calls if not result.error]
    assert ran and all(result.wall_time_s > 0 for result in ran)  # executed (and timed) in the sandbox
    assert {call.name for call, _ in calls} & {"read_file", "edit"}
    for trajectory in trajectories:  # every answer went through the isolated grader's hidden tests
        grade = trajectory.metrics
        assert "grade/tests_passed" in grade, grade
        passed = grade["grade/applied"] and 0 < grade["grade/tests_passed"] == grade["grade/tests_expected"]
        assert trajectory.reward == (1.0 if passed and not trajectory.cheating else 0.0), grade
    # RL weights published and applied in place: an engine reported serving one (its /health, read
    # once a second into the steps' metrics), or sampled tokens with one.
    served = max(record["metrics"].get("fleet/engine_version_min", 0) for record in read_metrics(run_dir))
    sampled = max(version for entry in collect_groups(run_dir) for trajectory in entry["group"].trajectories
                  for segment in trajectory.segments for turn in segment.turns if turn.generated is not None
                  for version, _ in turn.generated.versions)
    assert max(served, sampled) >= 2, (served, sampled)
    check = verify_run(run_dir)
    assert check.ok, check


def _results_after(turns, turn):
    """The tool results answering ``turn``'s calls (the next turn's), in call order."""
    following = turns[turns.index(turn) + 1:]
    return following[0].tool_results if following and following[0].role == "tool" else []


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_the_trajectory_viewer_renders_the_run_in_a_headless_browser(agent_run, tmp_path):
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium here (Debian: apt-get install chromium); the viewer is a static page")
    page = tmp_path / "view.html"
    viewer = relayrl("view", str(agent_run), "--step", "1", "--output", str(page))
    output, _ = viewer.communicate(timeout=300)
    assert viewer.returncode == 0 and page.exists(), output
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    # The page is built by its script from the embedded data: these exist only if the script ran.
    rendered = dom.count('class="trajectory"')
    assert rendered >= 8, dom[-2000:]  # step 1 trained two groups of eight
    assert re.search(r"(\d+) of \1 trajectories in \d+ groups", dom)
    assert 'class="result"' in dom and 'class="tok"' in dom and "call t1-0: grep(" in dom
    assert "continues from:" in dom  # a compaction segment with its summary


def test_relayrl_eval_runs_the_agent_on_code_search_and_on_a_bug_fix_task_file(agent_run, tmp_path, capsys):
    """The multi-turn path of relayrl eval: the agent harness, tools in sandboxes, the sandboxed F1 grader
    (code-search's held-out tasks) and the isolated hidden-test grader (a task directory, served by
    the code environment)."""
    from relayrl.cli.main import main
    from relayrl.environments.bugfix import SHIPPED_TASKS

    assert main(["eval", str(agent_run), "--tasks", "code-search", "--limit", "2", "--samples", "2",
                 "--out", str(tmp_path / "search")]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "search" / "summary.json").read_text())
    assert summary["spec"]["tasks"] == "code-search (eval split)" and summary["overall"]["samples"] == 4
    assert summary["overall"]["tool_calls"] > 0 and summary["overall"]["turns"] >= 1
    assert all(task["task_id"].startswith("cs-eval-") for task in summary["tasks"])
    assert main(["eval", str(agent_run), "--tasks", str(SHIPPED_TASKS), "--limit", "1", "--samples", "1",
                 "--out", str(tmp_path / "bugfix")]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "bugfix" / "summary.json").read_text())
    assert summary["spec"]["environment"]["name"] == "code" and summary["overall"]["samples"] == 1
    assert (tmp_path / "bugfix" / "trajectories.html").exists()


@pytest.mark.parametrize("example", sorted(path.name for path in (ROOT / "examples").glob("*.toml")))
def test_every_example_config_validates(example, tmp_path):
    import tomllib

    from relayrl.core.config import ConfigError, load_config
    from relayrl.core.plugins import registrations
    from relayrl.rollout.testing.models import save_tiny_model

    raw = tomllib.loads((ROOT / "examples" / example).read_text())
    environment = raw.get("rollout", {}).get("environment", "countdown")
    if environment not in registrations(None, "relayrl_rollout_environments"):
        # Validated by the plugin's own tests (plugins/relayrl-reasoning-gym validates examples/reasoning.toml).
        pytest.skip(f"{example} needs the plugin that provides environment {environment!r}, not installed here")
    overrides = []
    named = raw.get("model", {}).get("path")
    if named and not (Path(named) / "config.json").exists():
        # A model the example asks the user to import first (relayrl model import-gguf): the check
        # refuses the missing directory in one line; with a model there, the rest validates.
        with pytest.raises(ConfigError, match=f"model.path: {named} is not a model directory"):
            load_config(ROOT / "examples" / example)
        overrides = [f"model.path='{save_tiny_model(tmp_path / 'model')}'"]
    config = load_config(ROOT / "examples" / example, overrides=overrides)
    assert config.model.configured and config.trainer.steps > 0


def test_the_moe_example_samples_in_bfloat16_records_its_routing_and_the_trainer_replays_it(tmp_path):
    from relayrl.core.store import open_store
    from relayrl.weight_sync import WeightBus

    run_dir = tmp_path / "run"
    run = relayrl("run", str(ROOT / "examples" / "moe.toml"), "--run-dir", str(run_dir), "--steps", "4",
                  "--no-report", *SHORT)
    output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output[-3000:]
    records = read_metrics(run_dir)
    assert len(records) == 4
    for record in records:
        metrics = record["metrics"]
        # Every trained token's routing came from the engine and was forced; the bf16 engine's choice
        # and the fp32 trainer's own mostly agree.
        assert metrics["routing/replayed"] == 1.0 and 0.0 <= metrics["routing/set_differs"] < 0.5, metrics
        assert "routing/dropped_spans" not in metrics
    # The trainer trains in float32 and publishes bfloat16, which the engine applied.
    bus = WeightBus(open_store(str(run_dir)))
    newest = bus.committed_versions()[-1]
    assert {entry.dtype for entry in bus.read_manifest(newest).tensors} == {"bfloat16"}
    assert max(record["metrics"].get("weight_sync/version", 0) for record in records) >= 2
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "rank-00000.pt"
    import torch

    state = torch.load(checkpoint, weights_only=False, map_location="cpu")
    floats = [value for value in state["trainer"]["model"].values() if value.is_floating_point()]
    assert floats and {value.dtype for value in floats} == {torch.float32}
    # A published (bfloat16) version evaluates as the engines served it.
    evaluation = relayrl("eval", f"{run_dir}@{newest}", "--tasks", "countdown", "--limit", "4", "--samples", "2",
                         "--out", str(tmp_path / "eval"))
    output, _ = evaluation.communicate(timeout=600)
    assert evaluation.returncode == 0, output[-3000:]
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["spec"]["version"] == newest
