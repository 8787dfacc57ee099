"""The progress line says why nothing happens: what the buffer dropped, engines down, a fleet that skips everything."""

from __future__ import annotations

import io
import time

from relayrl.cli.run.display import Display
from relayrl.cli.run.layout import RunLayout


def display_for(tmp_path) -> tuple[RunLayout, Display]:
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir(parents=True)
    return layout, Display(layout, total_steps=10, stream=io.StringIO(), interactive=False)


def waiting(layout: RunLayout, seconds: float, **fields) -> None:
    layout.write_status("trainer", {"phase": "training", "step": 3, "steps": 10, "waiting_since": time.time() - seconds,
                                    "pending_groups": 1, "batch_groups": 4, **fields})


def test_a_trainer_that_trains_shows_no_waiting_reason_nor_one_that_waited_briefly(tmp_path):
    layout, display = display_for(tmp_path)
    layout.write_status("trainer", {"phase": "training", "step": 3, "steps": 10})
    assert "waiting" not in display.line()
    waiting(layout, 5, dropped_while_waiting={"zero_variance": 3})
    assert "waiting" not in display.line()


def test_every_group_dropped_as_zero_variance_is_named_with_a_hint(tmp_path):
    layout, display = display_for(tmp_path)
    waiting(layout, 75, dropped_while_waiting={"zero_variance": 37, "stale": 2})
    line = display.line()
    assert "waiting 1m15s: the buffer dropped all 39 groups that arrived (stale 2, zero-variance 37)" in line
    assert "same reward" in line


def test_engines_down_and_a_fleet_that_skips_everything(tmp_path):
    layout, display = display_for(tmp_path)
    waiting(layout, 40)
    layout.write_status("rollout", {"engines": [{"engine_id": "engine-0", "alive": False}], "metrics": {}})
    assert "waiting 40s: no engine is serving (engine-0 down)" in display.line()

    layout.write_status("rollout", {"engines": [
        {"engine_id": "engine-0", "alive": True, "weight_sync": {"held_paused": True, "broken_version": None}},
        {"engine_id": "engine-1", "alive": True, "weight_sync": {"held_paused": False, "broken_version": 7}}],
        "metrics": {}})
    assert ("no engine can serve: engine-0 paused after a failed weight apply; engine-1 cannot verify weight "
            "version 7 (asked for a fresh snapshot)") in display.line()

    layout, display = display_for(tmp_path / "second")
    waiting(layout, 40)
    counters = {"fleet/groups": 5.0, "fleet/groups_graded": 9.0, "fleet/zero_variance_skipped": 4.0}
    layout.write_status("rollout", {"engines": [{"engine_id": "engine-0", "alive": True}], "metrics": counters})
    assert "1/4 groups for the next batch" in display.line()  # the counters when the display first saw the wait
    layout.write_status("rollout", {"engines": [{"engine_id": "engine-0", "alive": True}],
                                    "metrics": {**counters, "fleet/groups_graded": 29.0,
                                                "fleet/zero_variance_skipped": 24.0}})
    assert "1/4 groups for the next batch" in display.line()  # not watched long enough to say more
    since, seen_at, before = display._fleet_at_wait
    display._fleet_at_wait = (since, seen_at - 10, before)  # ten seconds later
    assert "the fleet skipped all 20 groups it graded as zero-variance" in display.line()
    waiting(layout, 30)  # a new wait, watched from its own start for ten seconds: nothing graded since
    display.line()
    since, seen_at, before = display._fleet_at_wait
    display._fleet_at_wait = (since, seen_at - 10, before)
    assert "the fleet graded no group" in display.line()


def test_a_child_that_died_shows_the_last_lines_of_its_log(tmp_path):
    from relayrl.cli.run.events import write_event
    from relayrl.cli.run.launcher import log_tail

    log = tmp_path / "trainer.log"
    log.write_text("starting\nLoading: 10%\rLoading: 100%\n\n" + "".join(f"line {index}\n" for index in range(10))
                   + "OSError: [Errno 28] No space left on device\n")
    tail = log_tail(log, lines=3)
    assert tail == ["line 8", "line 9", "OSError: [Errno 28] No space left on device"]
    assert log_tail(tmp_path / "absent.log") == []
    assert log_tail(log, lines=20)[:2] == ["starting", "Loading: 100%"]  # a progress bar's last state
    layout, display = display_for(tmp_path)
    write_event(layout, "launcher", "restart", "trainer died (exit 1); restarting", level="warning",
                data={"process": "trainer", "exit": 1, "log_tail": tail, "log": str(log)})
    display.tick()
    printed = display.stream.getvalue()
    assert "[launcher] restart: trainer died (exit 1)" in printed and "No space left on device" in printed


def test_the_slowest_engines_last_weight_update_becomes_the_steps_weight_sync_metrics():
    from relayrl.cli.run.rollout_process import weight_update_metrics

    health = [{"engine_id": "engine-0", "weight_sync": {"fetch_s": 0.2, "pause_s": 0.01, "total_s": 0.3,
                                                        "held_paused": False}},
              {"engine_id": "engine-1", "weight_sync": {"fetch_s": 0.5, "pause_s": 0.03, "total_s": 0.6,
                                                        "held_paused": True}},
              {"engine_id": "engine-2", "alive": False}]
    assert weight_update_metrics(health) == {"weight_sync/fetch_s": 0.5, "weight_sync/apply_s": 0.03,
                                             "weight_sync/engine_update_s": 0.6, "fleet/engines_held_paused": 1.0}
    assert weight_update_metrics([{"engine_id": "engine-0"}]) == {}
