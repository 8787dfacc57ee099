"""``relayrl eval`` end to end on a short quickstart run: its numbers agree with the run's own rewards
and with the run's own held-out evaluations (``[eval]``), an interrupted eval continues to exactly
what an uninterrupted one records, mistakes are one line, and ``relayrl data filter`` keeps a band.

The run keeps its bus on S3 (moto on loopback) when the S3 test dependencies are installed, so
``relayrl eval`` rebuilds weight versions from S3; most evals run in this process (``main()``) to
spare a Python start-up each.
"""

from __future__ import annotations

import itertools
import json
import os
import re
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


def eval_main(capsys, *args: str) -> tuple[int, str, str]:
    """``relayrl ARGS`` in this process: (status, stdout, stderr)."""
    from relayrl.cli.main import main

    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def s3_bus(request) -> str | None:
    """An S3 prefix for the run's bus, or None (with the reason printed) without the S3 test dependencies."""
    try:
        request.getfixturevalue("s3_server")
    except pytest.skip.Exception as exc:
        print(f"the run's bus stays on local files: {exc}")
        return None
    import uuid

    return f"s3://relayrl-test/{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, s3_bus) -> Path:
    """The quickstart, warmed up and eight RL steps on a pool of 64 tasks, every group committed, with a
    held-out evaluation of 16 tasks before the first step and every two steps."""
    run_dir = tmp_path_factory.mktemp("quickstart") / "run"
    result = relayrl("run", str(ROOT / "examples" / "quickstart.toml"), "--run-dir", str(run_dir), "--steps", "8",
                     "--set", f"rollout.environment_options.tasks={TASKS}",
                     "--set", "rollout.skip_zero_variance=false", "--set", "buffer.admission=['staleness']",
                     "--set", "buffer.batch_groups=4", "--set", "eval.every_steps=2", "--set", "eval.tasks=16",
                     "--set", "eval.samples=4", *(["--set", f"store.url='{s3_bus}'"] if s3_bus else []), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


def test_the_run_kept_its_bus_on_s3_and_only_checkpoints_on_local_disk(run_dir, s3_bus):
    if s3_bus is None:
        pytest.skip("S3 tests need moto[server], boto3 and s3fs")
    from relayrl.core.store import open_store
    from relayrl.trainer.metrics import read_metrics

    # Rollout segments, weight versions, progress and fleet counters went through S3 (moto on loopback).
    assert [record["step"] for record in read_metrics(run_dir)] == list(range(1, 9))
    bus = open_store(s3_bus)
    assert bus.list("rollouts/") and bus.exists("weights/latest") and bus.exists("progress")
    assert not (run_dir / "rollouts").exists() and not (run_dir / "weights").exists()  # nothing on the local disk
    assert (run_dir / "checkpoints").exists()  # checkpoints stay node-local


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


def test_eval_of_a_runs_version_agrees_with_the_rewards_the_run_saw_at_that_version(run_dir, tmp_path, capsys):
    by_version = run_rewards_by_version(run_dir)
    version, seen = max(by_version.items(), key=lambda item: len(item[1]))
    out = tmp_path / "eval"
    status, stdout, stderr = eval_main(capsys, "eval", f"{run_dir}@{version}", "--tasks", "countdown", "--split",
                                       "train", "--samples", "4", "--k", "1,2,4", "--out", str(out))
    assert status == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    tasks = summary["overall"]["tasks"]  # the pool without any task that repeats a held-out prompt
    assert TASKS // 2 <= tasks <= TASKS and {task for task, _ in seen} <= {t["task_id"] for t in summary["tasks"]}
    assert f"| {tasks} | {tasks * 4} |" in stdout  # the markdown table on the terminal
    assert summary["spec"]["version"] == version and summary["overall"]["samples"] == tasks * 4
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == tasks * 4 and len({(r["task_id"], r["sample"]) for r in records}) == tasks * 4
    assert (out / "index.html").exists() and "trajectories.html" in (out / "index.html").read_text()
    assert (out / "trajectories.html").stat().st_size > 10_000
    # The run's prompt scheduler chose its own task mix: weigh each task's eval pass rate by how often
    # the run sampled it at that version, and compare with the run's mean reward there.
    pass_rate = {task["task_id"]: task["passed"] / task["samples"] for task in summary["tasks"]}
    counts = Counter(task for task, _ in seen)
    expected = sum(pass_rate[task] * count for task, count in counts.items()) / len(seen)
    observed = sum(reward for _, reward in seen) / len(seen)
    p = min(max(expected, 0.05), 0.95)
    noise = (p * (1 - p) * (1 / len(seen) + 1 / (tasks * 4))) ** 0.5
    assert abs(observed - expected) <= 4 * noise + 0.02, (observed, expected, len(seen))
    assert 0.05 < summary["overall"]["pass@1"] <= summary["overall"]["pass@2"] <= summary["overall"]["pass@4"]
    assert summary["overall"]["tokens_per_solved"] >= summary["overall"]["tokens"]


def test_the_runs_held_out_evaluations_are_in_its_metrics_report_and_agree_with_relayrl_eval(run_dir, tmp_path,
                                                                                               capsys):
    from relayrl.trainer.metrics import read_metrics

    results = [json.loads(line) for line in (run_dir / "eval" / "run.jsonl").read_text().splitlines()]
    steps = [result["step"] for result in results]
    # Before RL, then once at least two steps passed since the last one (a slow evaluation delays the next;
    # the schedule itself is unit-tested in relayrl-rollout).
    assert steps[0] == 0 and all(b - a >= 2 for a, b in itertools.pairwise(steps))
    assert all(r["tasks"] == 16 and r["samples"] == 64 and {"pass@1", "pass@4"} <= set(r) for r in results)
    # Each result reaches the trainer's next step through the rollout status. On a slow machine the
    # evaluation before RL can outlast the eight steps: only results recorded well before the last
    # step began must be in the metrics.
    records = read_metrics(run_dir)
    folded = {item["eval/step"]: item for item in (record["metrics"] for record in records) if "eval/pass@1" in item}
    by_step = {result["step"]: result for result in results}
    for step, item in folded.items():  # what the steps carry is what the evaluations recorded
        assert item["eval/pass@1"] == pytest.approx(by_step[step]["pass@1"])
    assert "Held-out evaluation" in (run_dir / "report" / "report.html").read_text()  # read from eval/run.jsonl
    finished = [result for result in results if result["time"] + result["wall_s"] < records[-2]["time"] - 5]
    if finished:
        assert folded, (finished, [record["time"] for record in records])
        import io

        from relayrl.cli.run.display import Display
        from relayrl.cli.run.layout import RunLayout

        display = Display(RunLayout(run_dir), total_steps=8, stream=io.StringIO(), interactive=False)
        display.close()  # reads every step and draws the last progress line
        assert re.search(r"eval pass@1 \d\.\d{3} \(step \d+\)", display.stream.getvalue())
    else:
        print(f"no evaluation ended before the last steps ({[r['wall_s'] for r in results]} s): nothing to fold")
    # The held-out split never reached training: no committed group asks a held-out prompt.
    from relayrl.cli.view import collect_groups
    from relayrl.environments.countdown import CountdownConfig, CountdownEnvironment

    held_out = {task.task_id: task for task in CountdownEnvironment(CountdownConfig(tasks=TASKS)).eval_tasks()[:16]}
    prompts = {task.instruction for task in held_out.values()}
    for entry in collect_groups(run_dir):
        first_turn = entry["group"].trajectories[0].segments[0].turns[0]
        assert first_turn.text not in prompts
    # An evaluation redone by relayrl eval on one version it sampled: sample for sample the same answer
    # (per-sample seeds), wherever the run's sample came from that version alone. Engines apply new
    # weights mid-evaluation, so most samples of an early evaluation span two versions; the version
    # and evaluation with the most single-version samples are compared.
    pure: dict[tuple[str, int], list[dict]] = {}
    for path in sorted((run_dir / "eval").glob("step-*.jsonl")):
        for record in map(json.loads, path.open()):
            low, high = record["versions"]
            if low == high:
                pure.setdefault((path.name, low), []).append(record)
    (_, version), during = max(pure.items(), key=lambda item: len(item[1]))
    assert len(during) >= 4
    out = tmp_path / "again"
    status, _, stderr = eval_main(capsys, "eval", f"{run_dir}@{version}", "--tasks", "countdown", "--split", "eval",
                                  "--limit", "16", "--samples", "4", "--out", str(out))
    assert status == 0, stderr
    after = {(r["task_id"], r["sample"]): r for r in map(json.loads, (out / "samples.jsonl").open())}
    assert len(after) == 64 and {(r["task_id"], r["sample"]) for r in during} <= set(held_out_samples(held_out))
    for record in during:
        again = after[record["task_id"], record["sample"]]
        assert [record[name] for name in ("reward", "final_text", "generated_tokens", "seed")] == \
               [again[name] for name in ("reward", "final_text", "generated_tokens", "seed")], record


def held_out_samples(held_out: dict) -> list[tuple[str, int]]:
    return [(task, sample) for task in held_out for sample in range(4)]


def test_an_interrupted_eval_continues_to_exactly_what_an_uninterrupted_one_records(run_dir, tmp_path, capsys):
    common = ["--tasks", "countdown", "--split", "train", "--limit", "32", "--samples", "2", "--seed", "3"]
    status, _, stderr = eval_main(capsys, "eval", str(run_dir), *common, "--out", str(tmp_path / "whole"))
    assert status == 0, stderr
    whole_summary = tmp_path / "whole" / "summary.json"
    out = tmp_path / "interrupted"
    records = out / "samples.jsonl"
    # As a user's foreground eval: started in the background by a non-interactive shell, pytest and its
    # children inherit SIGINT ignored, and Python then keeps ignoring it.
    process = subprocess.Popen([sys.executable, "-m", "relayrl.cli", "eval", str(run_dir), *common, "--out", str(out),
                                "--concurrency", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # The whole eval takes a few seconds: on a loaded machine it could finish between a check of its
    # records and the Ctrl-C. So it runs in 20 ms slices and is frozen (SIGSTOP) whenever it is checked:
    # once it has recorded a few tasks, Ctrl-C reaches it mid-eval, wherever the slices fell.
    deadline = time.monotonic() + 300
    while True:
        process.send_signal(signal.SIGSTOP)
        if records.exists() and records.read_text().count("\n") >= 4:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()  # a frozen process never closes its output
            pytest.fail(f"the eval ended or stalled before recording 4 tasks:\n{process.communicate()[0]}")
        process.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "run the same command to continue" in output, output
    done_before = records.read_text().count("\n")
    assert 4 <= done_before < json.loads(whole_summary.read_text())["overall"]["samples"]
    status, _, stderr = eval_main(capsys, "eval", str(run_dir), *common, "--out", str(out))
    assert status == 0, stderr
    assert "done, continuing" in stderr

    def outcome(path: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]
        return sorted((r["task_id"], r["sample"], r["seed"], r["reward"], r["generated_tokens"]) for r in rows)

    assert outcome(out) == outcome(tmp_path / "whole")  # nothing graded twice, nothing missing, same samples
    state = json.loads((out / "eval.json").read_text())
    assert len(state["sessions"]) == 2


def test_mistakes_are_one_line_and_a_model_directory_is_evaluated_at_version_zero(run_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    status, _, stderr = eval_main(capsys, "eval", str(run_dir), "--tasks", "countdown", "--limit", "4", "--samples", "2",
                                  "--out", str(out))
    assert status == 0, stderr
    status, _, error = eval_main(capsys, "eval", str(run_dir), "--tasks", "countdown", "--limit", "4", "--samples", "3",
                                 "--out", str(out))
    assert status == 2 and "holds an eval with other settings (samples)" in error
    for args, message in (
            (["--tasks", "nonsense"], "neither an environment"),
            (["--tasks", "countdown", "--samples", "2", "--k", "5"], "pass@k needs 1 <= k <= --samples (2)"),
            (["--tasks", "countdown", "--config", "x.toml"], "--config applies to a model directory")):
        status, _, error = eval_main(capsys, "eval", str(run_dir), *args, "--out", str(tmp_path / "other"))
        assert status == 2 and message in error, error
        assert error.count("\n") == 1 and error.startswith("relayrl: error: ")
    status, _, error = eval_main(capsys, "eval", f"{run_dir}@999", "--tasks", "countdown", "--out", str(tmp_path / "x"))
    assert status == 2 and "no such weight version on the run's bus (newest:" in error
    # The run's model directory (its fresh initial weights) with the quickstart's config for the rest.
    status, _, stderr = eval_main(capsys, "eval", str(run_dir / "model"), "--config",
                                  str(ROOT / "examples" / "quickstart.toml"), "--tasks", "countdown", "--limit", "4",
                                  "--samples", "2", "--out", str(tmp_path / "fresh"))
    assert status == 0, stderr
    summary = json.loads((tmp_path / "fresh" / "summary.json").read_text())
    assert summary["spec"]["version"] == 0 and summary["spec"]["tasks"] == "countdown (eval split)"
    assert [task["task_id"] for task in summary["tasks"]] == [f"cd-eval-{index}" for index in range(4)]
    # A config whose own [model] path does not exist here: MODEL replaces it before the config is checked.
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text((ROOT / "examples" / "quickstart.toml").read_text().replace(
        "[model]\n", '[model]\npath = "models/not-on-this-machine"\n'))
    status, _, stderr = eval_main(capsys, "eval", str(run_dir / "model"), "--config", str(elsewhere), "--tasks",
                                  "countdown", "--limit", "4", "--samples", "2", "--out", str(tmp_path / "fresh"))
    assert status == 0, stderr


def test_data_filter_keeps_the_band_and_reuses_an_evals_records(run_dir, tmp_path, capsys):
    from relayrl.sandbox import load_tasks

    evaluated = tmp_path / "eval"
    common = ["--split", "train", "--limit", "16", "--samples", "4"]
    status, _, stderr = eval_main(capsys, "eval", str(run_dir), "--tasks", "countdown", *common, "--out", str(evaluated))
    assert status == 0, stderr
    out = tmp_path / "filtered.jsonl"
    status, stdout, stderr = eval_main(capsys, "data", "filter", "countdown", "--records", str(evaluated), *common,
                                       "--keep", "0 < pass_rate < 1", "--out", str(out))
    assert status == 0, stderr
    assert "(16 done, continuing)" in stderr
    sessions = json.loads((evaluated / "eval.json").read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["tasks"] == 0  # nothing graded again
    summary = json.loads((evaluated / "summary.json").read_text())
    expected = [task["task_id"] for task in summary["tasks"] if 0 < task["passed"] < 4]
    kept = load_tasks(out)
    assert [task.task_id for task in kept] == expected and f"kept {len(expected)} of 16 tasks" in stdout
    assert all(0 < task.metadata["pass_rate"] < 1 and task.metadata["samples"] == 4 for task in kept)
    assert all(task.metadata["numbers"] and task.answer for task in kept)  # the task itself, whole


@pytest.mark.parametrize("condition,row,expected", [
    ("0.1 <= pass_rate <= 0.9", {"pass_rate": 0.5}, True),
    ("0.1 <= pass_rate <= 0.9", {"pass_rate": 1.0}, False),
    ("pass_rate > 0 and not samples < 8", {"pass_rate": 0.1, "samples": 8}, True),
    ("passed == 0 or mean_reward >= 0.5", {"passed": 1, "mean_reward": 0.2}, False),
    ("pass_rate > -1", {"pass_rate": 0.0}, True),
])
def test_keep_conditions(condition, row, expected):
    from relayrl.cli.evals.filter import parse_keep

    assert parse_keep(condition)(row) is expected


@pytest.mark.parametrize("condition", ["__import__('os').system('x')", "pass_rate", "difficulty > 1", "0.1 <=",
                                       "pass_rate > 0.1; 1", "pass_rate + 1 > 2"])
def test_keep_conditions_are_parsed_never_executed(condition):
    from relayrl.cli.evals.filter import parse_keep
    from relayrl.core.errors import RelayrlError

    with pytest.raises(RelayrlError, match="--keep"):
        parse_keep(condition)


def test_the_evals_sandboxes_cannot_see_the_run_its_bus_or_the_evals_output(run_dir, tmp_path):
    from relayrl.cli.evals.model import resolve_model
    from relayrl.cli.evals.runner import _sandbox_section

    model = resolve_model(f"{run_dir}@1", overrides=["store.url='file:///tmp/relayrl-elsewhere-bus'"], config_file=None)
    hidden = _sandbox_section(model, tmp_path / "out").hide_paths
    assert {str(run_dir.resolve()), "/tmp/relayrl-elsewhere-bus", str((tmp_path / "out").resolve())} <= set(hidden)
