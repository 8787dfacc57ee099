"""``relayrl run`` on inputs that cannot work: one line and a non-zero exit, before anything starts;
and a run whose first start failed, which a fixed config starts over (or ``--resume`` fixes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relayrl.cli.run.ledger import verify_run
from relayrl.cli.run.supervision import KNOWN_CAUSES, known_cause, recent_restarts

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart.toml"


def relayrl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "relayrl.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("override, said", [
    ("store.url='memory://bus'", "store.url: 'memory://bus' lives inside one process"),
    ("store.url='ftp://127.0.0.1:1/bus'", "store.url: the bus 'ftp://127.0.0.1:1/bus' cannot be reached"),
    ("rollout.group_size=100000", "rollout.group_size: at most 1024"),
    ("trainer.entropy_coef=inf", "trainer.entropy_coef: must be a finite number, got inf"),
    ("rollout.restart_window_s=nan", "rollout.restart_window_s: must be a finite number, got nan"),
    ("rollout.liveness_timeout_s=-1", "liveness_timeout_s must be at least 0"),
])
def test_an_input_that_cannot_work_is_one_line_and_starts_nothing(tmp_path, override, said):
    run_dir = tmp_path / "run"
    result = relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--set", override, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not run_dir.exists()


def test_a_run_whose_trainer_cannot_start_says_why_and_a_fixed_config_resumes_it(tmp_path):
    """The trainer dies building the model (an activation transformers does not know): the launcher says
    the trainer's own error, not only "see trainer.log"; a relative [store] url was recorded absolute;
    ``--resume`` with the fix (a [model] change, refused once anything was made with the old one) runs
    it to its end, and a fresh start in the same directory would have been accepted too."""
    from relayrl.cli.run.layout import RunLayout
    from relayrl.cli.run_cmd import never_started
    from relayrl.core.plugins import get_plugin_manager

    run_dir = tmp_path / "run"
    short = ["--set", "trainer.warmup.steps=5", "--set", "rollout.environment_options.tasks=2000",
             "--set", "buffer.batch_groups=4", "--set", "rollout.skip_zero_variance=false",
             "--set", "buffer.admission=['staleness']"]
    first = relayrl("run", str(QUICKSTART), "--run-dir", str(run_dir), "--steps", "2", "--no-report", *short,
                    "--set", "model.init.hidden_act='nope'", "--set", "store.url='bus'", cwd=tmp_path)
    assert first.returncode != 0
    said = first.stderr.strip().splitlines()[-1]
    assert "the trainer exited with" in said and "before publishing weights: KeyError: 'nope'" in said, said
    layout = RunLayout(run_dir)
    config = layout.load_config(pm=get_plugin_manager())
    assert config.store.url == str(tmp_path / "bus")  # a --resume from another directory finds the same bus
    assert never_started(layout, config)

    resumed = relayrl("run", "--resume", str(run_dir), "--no-report", "--set", "model.init.hidden_act='silu'",
                      timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert not never_started(layout, layout.load_config(pm=get_plugin_manager()))
    check = verify_run(run_dir)
    assert check.ok and check.final_step == 2, check.errors


def test_restarts_count_within_their_window_only():
    class Child:
        restart_times = [10.0, 500.0, 590.0]

    assert recent_restarts(Child(), 600.0, now=700.0) == [500.0, 590.0]
    assert recent_restarts(Child(), 0.0, now=10_000.0) == [10.0, 500.0, 590.0]  # 0: the whole run
    assert recent_restarts(object(), 600.0, now=1.0) == []


def test_a_dead_process_log_names_its_cause():
    tail = ["Traceback (most recent call last):", "OSError: [Errno 28] No space left on device: 'ckpt.partial'"]
    assert known_cause(tail).startswith("the disk is full (OSError: [Errno 28]")
    assert known_cause(["ValueError: something else"]) is None
    assert set(KNOWN_CAUSES)


def test_verify_run_reports_a_ledger_line_of_the_wrong_shape_instead_of_crashing(tmp_path):
    from relayrl.cli.run.ledger import read_ledger

    (tmp_path / "ledger.jsonl").write_text('{"step": 1, "trained": ["a"], "dropped": []}\n{"step": "x"}\n[]\n'
                                           '{"step": 2, "trained": "a", "dropped": []}\n{"step": 3, "tra')
    malformed: list[int] = []
    assert list(read_ledger(tmp_path, malformed=malformed)) == [1]
    assert malformed == [2, 3, 4]  # the last line, cut short by a kill, is not counted
    assert callable(verify_run)


def test_a_run_directory_deleted_under_a_running_run_stops_it_and_says_so(tmp_path):
    import shutil
    import time

    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "run", str(QUICKSTART), "--run-dir", str(run_dir),
                            "--no-report", "--set", "trainer.warmup.steps=5", "--set", "rollout.skip_zero_variance=false"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "status" / "rollout.json").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the whole fleet is up: the launcher supervises
        assert run.poll() is None, run.communicate()
        shutil.rmtree(run_dir, ignore_errors=True)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode not in (0, None)
    assert f"the run directory {run_dir} was deleted" in stderr.strip().splitlines()[-1], stderr[-2000:]


def test_the_synchronous_mode_polls_every_hand_over_at_its_own_interval():
    """Generation and training alternate: the trainer's buffer poll and the engines' manifest poll are
    idle time of the whole run, so the synchronous mode lowers both (a lower value the user set stays)."""
    from relayrl.cli.run_cmd import _synchronous_polls
    from relayrl.core.config import load_config
    from relayrl.rollout.config import SYNCHRONOUS_POLL_S

    config = Path(__file__).resolve().parents[3] / "examples" / "quickstart.toml"
    assert _synchronous_polls(load_config(config)) == []
    synchronous = load_config(config, overrides=["rollout.synchronous=true"])
    polls = _synchronous_polls(synchronous)
    assert polls == [f"buffer.poll_interval_s={SYNCHRONOUS_POLL_S}", f"weight_sync.poll_interval_s={SYNCHRONOUS_POLL_S}"]
    lowered = load_config(config, overrides=["rollout.synchronous=true", *polls])
    assert lowered.buffer.poll_interval_s == lowered.weight_sync.poll_interval_s == SYNCHRONOUS_POLL_S
    assert _synchronous_polls(lowered) == []
