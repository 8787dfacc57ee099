"""metrics.jsonl: one record per step, resumable, robust to a torn last line."""

from __future__ import annotations

import math

from relayrl.trainer.metrics import MetricsWriter, read_metrics


def test_write_read_resume_and_torn_lines(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(0, {"reward/mean": 0.1, "loss/value": 1.5})
        writer.write(1, {"reward/mean": 0.2, "entropy/token_mean": math.nan})
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 2, "metr')  # a crash mid-line
    with MetricsWriter(tmp_path, tensorboard=False) as writer:  # resumed run replays step 1
        writer.write(1, {"reward/mean": 0.25})
        writer.write(2, {"reward/mean": 0.3})
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [0, 1, 2]
    assert records[1]["metrics"] == {"reward/mean": 0.25}
    assert records[0]["metrics"]["loss/value"] == 1.5


def test_non_finite_values_become_null(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(0, {"x": math.inf})
    assert read_metrics(tmp_path)[0]["metrics"] == {"x": None}
