"""The progress and fleet-counter records: versioned, refused when newer, and readable when written
as JSON by relayrl 0.1 (so its runs resume)."""

from __future__ import annotations

import json

import pytest

from relayrl.buffer.progress import (
    FLEET_PREFIX,
    PROGRESS_KEY,
    FleetCounters,
    Progress,
    read_fleet_counters,
    read_progress,
    write_fleet_counters,
    write_progress,
)
from relayrl.core import codec
from relayrl.core.errors import WireError
from relayrl.core.store import open_store


def test_progress_round_trips_and_is_empty_before_the_first_step(tmp_path):
    store = open_store(str(tmp_path))
    assert read_progress(store) == Progress()
    write_progress(store, Progress(step=3, version=4, consumed={"rollout-0": 12}))
    assert read_progress(store) == Progress(step=3, version=4, consumed={"rollout-0": 12})


def test_fleet_counters_round_trip_and_add_up(tmp_path):
    store = open_store(str(tmp_path))
    write_fleet_counters(store, "rollout-0", FleetCounters(graded_groups=4, reward_sum=6, reward_count=8,
                                                           behaviour={"turns": 9.0}))
    write_fleet_counters(store, "rollout-1", FleetCounters(graded_groups=1))
    store.put(f"{FLEET_PREFIX}broken.json", b"\x93garbage")  # an unreadable record is left out
    counters = read_fleet_counters(store)
    assert sorted(counters) == ["rollout-0", "rollout-1"]
    assert counters["rollout-0"].totals() == {"graded_groups": 4.0, "committed_groups": 0.0, "skipped_groups": 0.0,
                                              "reward_sum": 6.0, "reward_count": 8.0, "generated_tokens": 0.0,
                                              "turns": 9.0}


def test_records_of_a_newer_schema_are_refused_naming_the_object(tmp_path):
    store = open_store(str(tmp_path))
    store.put(PROGRESS_KEY, codec.encode({"schema_version": 99, "step": 1}))
    with pytest.raises(WireError, match="progress"):
        read_progress(store)


def test_json_records_of_relayrl_0_1_are_still_read(tmp_path):
    store = open_store(str(tmp_path))
    store.put(PROGRESS_KEY, json.dumps({"step": 7, "version": 8, "consumed": {"rollout-0": 3}}).encode())
    store.put(f"{FLEET_PREFIX}rollout-0.json", json.dumps({"graded_groups": 2.0, "reward_sum": 1.0,
                                                           "tokens": 40.0}).encode())
    assert read_progress(store) == Progress(step=7, version=8, consumed={"rollout-0": 3})
    assert read_fleet_counters(store)["rollout-0"] == FleetCounters(graded_groups=2.0, reward_sum=1.0,
                                                                    behaviour={"tokens": 40.0})
