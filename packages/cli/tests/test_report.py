"""relayrl report on a synthetic run directory: plots, summary, alarms, missing metrics."""

from __future__ import annotations

import json

import pytest

from relayrl.cli.main import main
from relayrl.cli.report import write_report
from relayrl.core import codec, wire
from relayrl.core.errors import RelayrlError
from relayrl.core.store import open_store


def make_run(run_dir, steps=40):
    with open(run_dir / "metrics.jsonl", "w") as handle:
        for step in range(steps):
            metrics = {"reward/mean": 0.05 + 0.01 * step, "reward/std": 0.1, "entropy/token_mean": 0.7,
                       "entropy/kept_mean": 0.5, "mismatch/kl_k3": 1e-4, "mismatch/kl_k1": 2e-4,
                       f"staleness/hist/{step % 3}": 16.0, "response/tokens_mean": 10.0 + step,
                       "trainer/tokens_per_s": 2000.0 + step}
            handle.write(json.dumps({"step": step, "time": 1000.0 + 2 * step, "metrics": metrics}) + "\n")
    store = open_store(str(run_dir))
    event = wire.RunEvent(time=1010.0, source="trainer", kind="alarm", level="warning",
                          message="entropy/token_mean = 0.05 at step 5", data={"step": 5})
    store.put("events/00000001-alarm", codec.encode(event))


def test_report_writes_plots_summary_and_alarms(tmp_path):
    make_run(tmp_path)
    report = write_report(tmp_path)
    names = sorted(path.name for path in report.plots)
    assert names == ["entropy.png", "lengths.png", "mismatch.png", "reward.png", "staleness.png", "throughput.png"]
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in report.plots)
    assert report.summary["steps"] == 40 and report.summary["wall_time_s"] == 78.0
    assert report.summary["reward_first_tenth"] == pytest.approx(0.05 + 0.01 * 1.5)
    assert report.summary["reward_last_tenth"] == pytest.approx(0.05 + 0.01 * 37.5)
    markdown = report.markdown_path.read_text()
    assert "step 5: entropy/token_mean = 0.05 at step 5" in markdown
    assert "Not recorded in this run: Tool use (every graded trajectory), Weight sync (s)." in markdown
    page = report.html_path.read_text()
    assert page.count("data:image/png;base64,") == 6 and "<li>step 5:" in page


def test_cli_report_and_errors(tmp_path, capsys):
    make_run(tmp_path, steps=5)
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    assert "report: " in capsys.readouterr().out and (tmp_path / "out/report.html").exists()
    with pytest.raises(RelayrlError, match="no metrics.jsonl"):
        write_report(tmp_path / "missing")
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_agentic_runs_get_a_tool_use_plot_and_a_per_tenth_table(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for step in range(1, 21):
            metrics = {"reward/fleet_graded_mean": step / 20, "reward/fleet_mean": step / 50,
                       "fleet/tool_calls_per_trajectory": 2.0, "fleet/parallel_turn_share": 0.5,
                       "fleet/turns_per_trajectory": 3.0, "fleet/compacted_share": 0.25}
            handle.write(json.dumps({"step": step, "time": 1000.0 + step, "metrics": metrics}) + "\n")
    report = write_report(tmp_path)
    assert "tools.png" in {path.name for path in report.plots}
    assert report.summary["reward_metric"] == "reward/fleet_graded_mean"  # the grader's, not the shaped one
    rows = [line for line in report.markdown_path.read_text().splitlines() if line.startswith("| ")]
    table = rows[rows.index(next(row for row in rows if row.startswith("| steps | reward"))):]
    assert table[0] == ("| steps | reward (grader) | reward (shaped) | tool calls | parallel turns | turns | "
                        "compacted |")
    assert table[1] == "| 1-2 | 0.075 | 0.030 | 2.000 | 0.500 | 3.000 | 0.250 |"
    assert table[10].startswith("| 19-20 | 0.975 |") and len(table) == 11
    assert "<h2>Per tenth of the run</h2>" in report.html_path.read_text()


def test_the_length_penalty_table_compares_budget_steps_with_unconstrained_ones(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for step in range(1, 21):
            budget = (step - 1) // 5 % 2 == 1  # steps 6-10 and 16-20
            metrics = {"reward/fleet_graded_mean": 0.5, "length_penalty/budget_phase": float(budget),
                       "fleet/shaping_per_trajectory": -0.1 if budget else 0.0,
                       "fleet/tokens_per_trajectory": 30.0 if budget else 40.0}
            handle.write(json.dumps({"step": step, "time": 1000.0 + step, "metrics": metrics}) + "\n")
    report = write_report(tmp_path)
    rows = [line for line in report.markdown_path.read_text().splitlines() if line.startswith("| ")]
    start = rows.index("| phase | steps | reward (grader) | length penalty | tokens |")
    assert rows[start + 1:start + 3] == ["| unconstrained | 10 | 0.500 | 0.000 | 40.000 |",
                                         "| budget | 10 | 0.500 | -0.100 | 30.000 |"]
    assert "<h2>Length penalty: budget steps" in report.html_path.read_text()


def test_the_tool_table_gives_each_tools_share_of_trajectories_per_tenth_of_the_versions():
    from relayrl.cli.report import tool_use_table

    # Versions 1-20 in tenths of two versions; "list" is dropped after version 4.
    trajectories = [(version, ["list", "grep"] if version <= 4 else ["grep", "grep"]) for version in range(1, 21)]
    trajectories += [(1, []), (2, [])]  # answered without a tool
    rows = tool_use_table(trajectories)
    assert rows[0] == "| versions | trajectories | grep | list |"
    assert rows[2] == "| 1-2 | 4 | 0.500 | 0.500 |"
    assert rows[3] == "| 3-4 | 2 | 1.000 | 1.000 |"
    assert rows[4] == "| 5-6 | 2 | 1.000 | 0.000 |"
    assert len(rows) == 2 + 10
    assert tool_use_table([(1, []), (2, [])]) == []  # no tool was called: no table
    assert tool_use_table([]) == []


HOSTILE_LINES = ['[]', '{"step": "7", "time": 1.0, "metrics": {}}', '{"step": 3, "metrics": []}', '"text"',
                 '{"step": true, "time": 1.0, "metrics": {}}', '{"time": 1.0, "metrics": {"reward/mean": 1}}',
                 '{"step": 41, "time": "soon", "metrics": {}}', '{"step": 40, "time": 1100.0, "metrics": '
                 '{"reward/mean": "high", "entropy/token_mean": 0.6}}', '{"step": 2, "ti']


def test_lines_of_another_shape_in_metrics_jsonl_are_skipped_by_every_reader(tmp_path):
    """A valid-JSON line of the wrong shape crashed relayrl report and, through the display, the launcher."""
    import io

    from relayrl.cli.run.display import Display
    from relayrl.cli.run.layout import RunLayout
    from relayrl.trainer.metrics import read_metrics

    make_run(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write("\n".join(HOSTILE_LINES))
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == list(range(41))  # step 40 kept, its bad value dropped
    assert records[-1]["metrics"] == {"entropy/token_mean": 0.6}
    report = write_report(tmp_path)
    assert report.summary["steps"] == 41
    display = Display(RunLayout(tmp_path), total_steps=50, stream=io.StringIO(), interactive=False)
    display.close()
    assert "step 40/50" in display.stream.getvalue()


def test_restarts_and_resumes_are_listed_with_their_downtime_and_the_config_is_summarised(tmp_path):
    make_run(tmp_path, steps=20)  # a step every 2 s from t=1000
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    shifted = [json.loads(line) for line in lines]
    for record in shifted[10:]:  # the trainer was killed after step 9 and needed 30 s more to step again
        record["time"] += 30.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in shifted))
    store = open_store(str(tmp_path))
    for key, kind, source, at in (("2", "restart", "launcher", 1019.0), ("3", "resumed", "trainer", 1040.0)):
        event = wire.RunEvent(time=at, source=source, kind=kind, level="warning", message=f"{kind} | here",
                              data={"process": "trainer"})
        store.put(f"events/0000000{key}-{kind}", codec.encode(event))
    (tmp_path / "config.json").write_text(json.dumps({"model": {"init": {"hidden_size": 64}, "dtype": "float32"},
                                                      "rollout": {"environment": "countdown", "engines": 2},
                                                      "trainer": {"steps": 20}}))
    report = write_report(tmp_path)
    # One gap of 32 s where 2 s is typical: 30 s lost, charged to the first event inside it.
    assert report.summary["restarts"] == 1 and report.summary["interruptions"] == 2
    assert report.summary["downtime_s"] == pytest.approx(30.0)
    markdown = report.markdown_path.read_text()
    assert "| 19 | 9 | launcher restart: restart / here | 30.0 |" in markdown
    assert "| 40 | 9 | trainer resumed: resumed / here | 0.0 |" in markdown
    assert "| model init | hidden_size=64 |" in markdown and "| engines | 2 |" in markdown
    assert "Interruptions (restarts, resumes)" in report.html_path.read_text()
