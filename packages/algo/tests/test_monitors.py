"""Monitors: the EWMA alarm rule by hand, phrase ratios, behaviour metrics."""

from __future__ import annotations

import pytest

from relayrl.algo.config import AlgoSection, MonitorsSection, build_monitors
from relayrl.algo.hookspecs import MONITORS
from relayrl.algo.monitors import (
    AlarmSection,
    EWMAAlarm,
    MonitorSet,
    PhraseMonitor,
    SeriesMonitor,
    behaviour_metrics,
)
from relayrl.algo.testing import MonitorTests
from relayrl.core.wire import GeneratedSpan, ToolCall, Trajectory, TrajectorySegment, Turn


def test_ewma_updates_by_hand():
    rule = EWMAAlarm(AlarmSection(alpha=0.5, warmup=0, threshold=100.0))
    rule.update(1.0)
    assert (rule.mean, rule.variance) == (1.0, 0.0)
    rule.update(3.0)  # delta 2: mean 1 + 0.5 * 2 = 2; variance (1 - 0.5) * (0 + 0.5 * 4) = 1
    assert (rule.mean, rule.variance) == (2.0, 1.0)
    fired, z, expected = rule.update(5.0)
    assert (fired, z, expected) == (False, 3.0, 2.0)


def test_alarm_fires_on_a_drop_after_warmup_only_in_the_watched_direction():
    config = AlarmSection(alpha=0.1, threshold=4.0, warmup=10, min_std=1e-3)

    def declining_monitor():
        monitor = SeriesMonitor("entropy", "entropy/token_mean", "down", config)
        alarms = []
        for step in range(30):  # a slowly, noisily declining entropy: no alarm
            value = 0.7 - 0.002 * step + (0.01 if step % 2 else -0.01)
            alarms += monitor.observe(step, {"entropy/token_mean": value})[1]
        assert alarms == []
        return monitor

    assert declining_monitor().observe(30, {"entropy/token_mean": 1.5})[1] == []  # a jump up is not watched
    collapse = declining_monitor().observe(30, {"entropy/token_mean": 0.05})[1]
    assert len(collapse) == 1 and collapse[0].metric == "entropy/token_mean" and collapse[0].z_score < -4
    assert "entropy/token_mean = 0.05 at step 30" in collapse[0].message


def test_a_steady_series_needs_a_material_change_to_alarm():
    config = AlarmSection(alpha=0.1, threshold=4.0, warmup=5, min_std=1e-3, min_relative_change=0.1)
    rule = EWMAAlarm(config)
    for _ in range(20):
        rule.update(6.0)  # response length of a converged policy: flat
    fired, z, _ = rule.update(5.7)  # -5%: far beyond 4 stds of a flat series, but immaterial
    assert z < -4 and not fired
    fired, _, _ = rule.update(4.0)  # -33%: an alarm
    assert fired


def test_no_alarm_during_warmup_and_state_round_trip():
    monitor = SeriesMonitor("kl", "mismatch/kl_k3", "up", AlarmSection(warmup=5))
    assert monitor.observe(0, {"mismatch/kl_k3": 0.001})[1] == []
    assert monitor.observe(1, {"mismatch/kl_k3": 10.0})[1] == []
    state = monitor.state()
    other = SeriesMonitor("kl", "mismatch/kl_k3", "up", AlarmSection(warmup=5))
    other.restore(state)
    assert other.rule.state() == monitor.rule.state()


@pytest.mark.parametrize("text, matches", [
    ("Okay, okay, I mean the kernel is wrong", True),
    ("okay holy crap I need to get this optimized", True),
    ("OK. Okay... wait", False),
    ("Okay, let me look at the failing test first.", False),
    ("  okay okay okay", True),
    ("The code is okay okay", False),
])
def test_default_not_okay_phrase(text, matches):
    assert PhraseMonitor().ratios([text])["phrase/not_okay"] == float(matches)


def test_phrase_ratio_rising_raises_an_alarm():
    monitor = PhraseMonitor(alarm=AlarmSection(warmup=5, threshold=3.0, min_std=0.02))
    calm = ["Okay, let me read the file."] * 9 + ["okay okay I mean"]
    for step in range(10):
        metrics, alarms = monitor.observe(step, {}, calm)
        assert metrics == {"phrase/not_okay": 0.1} and alarms == []
    metrics, alarms = monitor.observe(10, {}, ["okay okay I mean"] * 6 + ["Okay, fine."] * 4)
    assert metrics["phrase/not_okay"] == 0.6 and len(alarms) == 1


def test_monitor_set_runs_phrase_monitors_before_series_watching_them():
    phrases = PhraseMonitor(alarm=AlarmSection(warmup=100))
    watcher = SeriesMonitor("watch", "phrase/not_okay", "up", AlarmSection(warmup=0, threshold=0.5, min_std=0.01))
    monitor_set = MonitorSet([watcher, phrases])
    added, _ = monitor_set.observe(0, {}, ["fine"])
    assert added == {"phrase/not_okay": 0.0}
    _, alarms = monitor_set.observe(1, {}, ["okay okay I mean"])
    assert [alarm.monitor for alarm in alarms] == ["watch"]


def test_behaviour_metrics_by_hand():
    def turn(tokens, calls):
        return Turn(role="assistant", generated=GeneratedSpan.build([1] * tokens, [0.0] * tokens, 0),
                    tool_calls=[ToolCall(id=str(i), name="bash") for i in range(calls)])

    a = Trajectory(trajectory_id="a", task_id="t", group_id="g", sample_index=0,
                   segments=[TrajectorySegment(turns=[turn(10, 2), turn(5, 0)])])
    b = Trajectory(trajectory_id="b", task_id="t", group_id="g", sample_index=1,
                   segments=[TrajectorySegment(turns=[turn(3, 4)]), TrajectorySegment(turns=[turn(2, 1)])])
    metrics = behaviour_metrics([a, b])
    assert metrics["response/tokens_mean"] == 10.0 and metrics["response/tokens_max"] == 15.0
    assert metrics["response/turns_mean"] == 2.0
    assert metrics["response/tool_calls_per_turn"] == (2 + 0 + 4 + 1) / 4
    assert metrics["response/segments_mean"] == 1.5


class TestEveryRegisteredMonitor(MonitorTests):
    """Every registered monitor, built as `[algo.monitors]` builds it, passes the suite a plugin passes;
    and so does the set of them a run uses."""

    @pytest.fixture(params=[*sorted(MONITORS.registrations()), "<the default set>"])
    def make_monitor(self, request):
        if request.param == "<the default set>":
            return lambda: build_monitors(AlgoSection())
        record = MONITORS.registrations()[request.param]
        return lambda: record.factory(MonitorsSection())
