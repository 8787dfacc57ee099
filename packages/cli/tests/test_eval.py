"""``relayrl eval`` end to end on a short quickstart run: its numbers agree with the run's own rewards,
an interrupted eval continues to exactly what an uninterrupted one records, and mistakes are one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TASKS = 64


def relayrl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relayrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The quickstart, warmed up and three RL steps on a pool of 64 tasks, every group committed."""
    run_dir = tmp_path_factory.mktemp("quickstart") / "run"
    result = relayrl("run", str(ROOT / "examples" / "quickstart.toml"), "--run-dir", str(run_dir), "--steps", "3",
                     "--no-report", "--set", f"rollout.environment_options.tasks={TASKS}",
                     "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
                     "--set", "buffer.batch_groups=4", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


def run_rewards_by_version(run_dir: Path) -> dict[int, list[tuple[str, float]]]:
    """(task, reward) of every committed trajectory whose tokens all came from one policy version."""
    from relayrl.cli.view import collect_groups

    found: dict[int, list[tuple[str, float]]] = {}
    for entry in collect_groups(run_dir):
        for trajectory in entry["group"].trajectories:
            versions = {version for segment in trajectory.segments for turn in segment.turns if turn.generated
                        for version in turn.generated.token_versions()}
            if len(versions) == 1:
                found.setdefault(versions.pop(), []).append((trajectory.task_id, float(trajectory.reward)))
    return found


def test_eval_of_a_runs_version_agrees_with_the_rewards_the_run_saw_at_that_version(run_dir, tmp_path):
    by_version = run_rewards_by_version(run_dir)
    version, seen = max(by_version.items(), key=lambda item: len(item[1]))
    out = tmp_path / "eval"
    result = relayrl("eval", f"{run_dir}@{version}", "--tasks", "countdown", "--split", "train", "--samples", "8",
                     "--k", "1,4,8", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"| {TASKS} | {TASKS * 8} |" in result.stdout  # the markdown table on the terminal
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spec"]["version"] == version and summary["overall"]["samples"] == TASKS * 8
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == TASKS * 8 and len({(r["task_id"], r["sample"]) for r in records}) == TASKS * 8
    assert (out / "index.html").exists() and "trajectories.html" in (out / "index.html").read_text()
    assert (out / "trajectories.html").stat().st_size > 10_000
    # The run's prompt scheduler chose its own task mix: weigh each task's eval pass rate by how often
    # the run sampled it at that version, and compare with the run's mean reward there.
    pass_rate = {task["task_id"]: task["passed"] / task["samples"] for task in summary["tasks"]}
    counts = Counter(task for task, _ in seen)
    expected = sum(pass_rate[task] * count for task, count in counts.items()) / len(seen)
    observed = sum(reward for _, reward in seen) / len(seen)
    p = min(max(expected, 0.05), 0.95)
    noise = (p * (1 - p) * (1 / len(seen) + 1 / (TASKS * 8))) ** 0.5
    assert abs(observed - expected) <= 4 * noise + 0.02, (observed, expected, len(seen))
    assert 0.05 < summary["overall"]["pass@1"] <= summary["overall"]["pass@4"] <= summary["overall"]["pass@8"]
    assert summary["overall"]["tokens_per_solved"] >= summary["overall"]["tokens"]


def test_an_interrupted_eval_continues_to_exactly_what_an_uninterrupted_one_records(run_dir, tmp_path):
    common = ["--tasks", "countdown", "--split", "train", "--samples", "4", "--seed", "3"]
    whole = relayrl("eval", str(run_dir), *common, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "interrupted"
    records = out / "samples.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "eval", str(run_dir), *common, "--out", str(out),
                                "--concurrency", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (records.exists() and records.read_text().count("\n") >= 8) and time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "run the same command to continue" in output, output
    done_before = records.read_text().count("\n")
    assert 8 <= done_before < TASKS * 4
    resumed = relayrl("eval", str(run_dir), *common, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "done, continuing" in resumed.stderr

    def outcome(path: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]
        return sorted((r["task_id"], r["sample"], r["seed"], r["reward"], r["generated_tokens"]) for r in rows)

    assert outcome(out) == outcome(tmp_path / "whole")  # nothing graded twice, nothing missing, same samples
    state = json.loads((out / "eval.json").read_text())
    assert len(state["sessions"]) == 2


def test_mistakes_are_one_line_and_a_model_directory_is_evaluated_at_version_zero(run_dir, tmp_path, capsys):
    from relayrl.cli.main import main

    def eval_in_process(*args: str) -> tuple[int, str]:  # mistakes fail before any engine starts
        status = main(["eval", *args])
        return status, capsys.readouterr().err

    out = tmp_path / "eval"
    first = relayrl("eval", str(run_dir), "--tasks", "countdown", "--limit", "4", "--samples", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr
    status, error = eval_in_process(str(run_dir), "--tasks", "countdown", "--limit", "4", "--samples", "3",
                                    "--out", str(out))
    assert status == 2 and "holds an eval with other settings (samples)" in error
    for args, message in (
            (["--tasks", "nonsense"], "neither an environment"),
            (["--tasks", "countdown", "--samples", "2", "--k", "5"], "pass@k needs 1 <= k <= --samples (2)"),
            (["--tasks", "countdown", "--config", "x.toml"], "--config applies to a model directory")):
        status, error = eval_in_process(str(run_dir), *args, "--out", str(tmp_path / "other"))
        assert status == 2 and message in error, error
        assert error.count("\n") == 1 and error.startswith("relayrl: error: ")
    status, error = eval_in_process(f"{run_dir}@999", "--tasks", "countdown", "--out", str(tmp_path / "other"))
    assert status == 2 and "no such weight version on the run's bus (newest:" in error
    # The run's model directory (its fresh initial weights) with the quickstart's config for the rest.
    fresh = relayrl("eval", str(run_dir / "model"), "--config", str(ROOT / "examples" / "quickstart.toml"),
                    "--tasks", "countdown", "--limit", "4", "--samples", "2", "--out", str(tmp_path / "fresh"))
    assert fresh.returncode == 0, fresh.stderr
    summary = json.loads((tmp_path / "fresh" / "summary.json").read_text())
    assert summary["spec"]["version"] == 0 and summary["spec"]["tasks"] == "countdown (eval split)"
    assert [task["task_id"] for task in summary["tasks"]] == [f"cd-eval-{index}" for index in range(4)]
