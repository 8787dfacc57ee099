"""Trainer side on local files and on S3: ingest, commit-order batches, budgets, drops, metrics, cursor."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from relayrl.buffer import Buffer, BufferSection, BufferState, SegmentWriter, StalenessSection, prune_segments
from relayrl.buffer.segments import segment_key
from relayrl.buffer.testing import make_group
from relayrl.core import codec, wire
from relayrl.core.errors import ChecksumMismatch, WireError
from relayrl.core.store import open_store

NO_REBALANCE = dict(restart={"rebalance_batches": 0})


def config(**fields) -> BufferSection:
    return msgspec.convert(fields, BufferSection)


def commit(store, producer_id, groups, *, at, per_segment=2):
    """Commit ``groups`` as one producer; segment ``created_at`` values are ``at``, ``at + 1`` ..."""
    clock = itertools.count(at)
    writer = SegmentWriter(store, producer_id, groups_per_segment=per_segment, clock=lambda: float(next(clock)))
    for group in groups:
        writer.add(group)
    writer.flush()
    return writer.committed


def ids(batch):
    return [group.group.group_id for group in batch.groups]


def test_batches_are_complete_groups_in_commit_order_across_producers(store):
    # Producer b commits earlier than producer a, but a's segments are listed first.
    commit(store, "a", [make_group(f"a{i}", version=0) for i in range(4)], at=10)
    commit(store, "b", [make_group(f"b{i}", version=0) for i in range(4)], at=5)
    buffer = Buffer(store, config(batch_groups=3))
    assert buffer.poll() == 8
    batches = [buffer.next_batch(0) for _ in range(2)]
    assert [ids(batch) for batch in batches] == [["b0", "b1", "b2"], ["b3", "a0", "a1"]]
    assert buffer.next_batch(0) is None and buffer.pending == 2
    last = buffer.next_batch(0, partial=True)
    assert ids(last) == ["a2", "a3"] and [b.index for b in [*batches, last]] == [0, 1, 2]
    assert all(len(group.group.trajectories) == 4 for group in last.groups)


def test_batches_do_not_depend_on_when_polls_happened(store_url):
    store = open_store(store_url)
    commit(store, "a", [make_group(f"a{i}") for i in range(6)], at=1)
    commit(store, "b", [make_group(f"b{i}") for i in range(6)], at=2)
    all_at_once = Buffer(store, config(batch_groups=4))
    all_at_once.poll()
    reference = [ids(all_at_once.next_batch(0)) for _ in range(3)]

    other = open_store(f"{store_url}-copy")
    trickled = Buffer(other, config(batch_groups=4))
    # The same segments reach the second bus one at a time, newest first, with polls in between.
    for key in reversed(store.list("rollouts/")):
        other.put(key, store.get(key), if_absent=True)
        trickled.poll()
    assert [ids(trickled.next_batch(0)) for _ in range(3)] == reference


def test_token_budget_takes_the_longest_fitting_run_and_batches_oversized_groups_alone(store):
    sizes = [100, 100, 300, 50, 2000, 60]
    commit(store, "a", [make_group(f"g{i}", generated_tokens=n, context_tokens=0, rewards=(0.0, 1.0))
                        for i, n in enumerate(sizes)], at=1)
    buffer = Buffer(store, config(token_budget=1300))
    buffer.poll()
    tokens_of = {f"g{i}": pending.tokens for i, pending in enumerate(buffer._pending)}
    assert tokens_of["g0"] == 2 * (100 + 8 * 2)  # two trajectories: generated plus tool-output context tokens
    assert buffer.pending_tokens == sum(tokens_of.values())
    first = buffer.next_batch(0)
    assert ids(first) == ["g0", "g1", "g2", "g3"] and first.metrics.tokens == sum(tokens_of[g] for g in ids(first))
    oversized = buffer.next_batch(0)
    assert ids(oversized) == ["g4"] and oversized.metrics.oversized_groups == 1
    assert buffer.next_batch(0) is None
    assert ids(buffer.next_batch(0, partial=True)) == ["g5"]


def test_drops_are_recorded_with_reasons_and_counted(store):
    groups = [make_group("fresh", version=9), make_group("stale", version=2),
              make_group("uniform", version=9, rewards=(1.0, 1.0, 1.0, 1.0)), make_group("fresh2", version=8),
              make_group("future", version=11)]
    commit(store, "a", groups, at=1)
    buffer = Buffer(store, config(batch_groups=2, staleness={"max_staleness": 2}))
    buffer.poll()
    batch = buffer.next_batch(10)
    assert ids(batch) == ["fresh", "fresh2"]
    assert [(d.group_id, d.reason) for d in batch.dropped] == [("stale", "stale"), ("uniform", "zero_variance")]
    assert batch.metrics.dropped == {"stale": 1, "zero_variance": 1}
    assert batch.metrics.staleness == {1: 1, 2: 1}
    assert buffer.pending == 1  # "future" was not scanned: the batch was full before it
    end = buffer.next_batch(10, partial=True)
    assert end.groups == () and [(d.group_id, d.reason) for d in end.dropped] == [("future", "future_version")]
    assert end.state.resolved_groups == 5


def test_a_waiting_trainer_resolves_drops_without_a_batch(store):
    # Everything pending is too stale for a batch: next_batch changes nothing, resolve_drops settles them.
    groups = [make_group(f"old{i}", version=1) for i in range(3)] + [make_group("fresh", version=9)]
    commit(store, "a", groups, at=1)
    buffer = Buffer(store, config(batch_groups=2, staleness={"max_staleness": 2}, **NO_REBALANCE))
    buffer.poll()
    assert buffer.next_batch(10) is None and buffer.pending == 4
    drops = buffer.resolve_drops(10)
    assert [(d.group_id, d.reason) for d in drops] == [("old0", "stale"), ("old1", "stale"), ("old2", "stale")]
    assert buffer.pending == 1 and buffer.state().resolved_groups == 3 and buffer.resolve_drops(10) == ()
    restored = Buffer(store, config(batch_groups=2, staleness={"max_staleness": 2}, **NO_REBALANCE))
    restored.restore(buffer.state())
    restored.poll()
    assert restored.pending == 1  # resolved drops are never ingested again
    commit(store, "b", [make_group("fresh2", version=10)], at=10)
    restored.poll()
    assert ids(restored.next_batch(10)) == ["fresh", "fresh2"]


def test_down_weighted_groups_carry_their_weight_and_reason(store):
    commit(store, "a", [make_group("g0", version=5), make_group("g1", version=3)], at=1)
    buffer = Buffer(store, config(batch_groups=2, staleness={"max_staleness": 1, "action": "down-weight"}))
    buffer.poll()
    batch = buffer.next_batch(6)
    assert [(g.group.group_id, g.weight, g.weight_reason, g.staleness) for g in batch.groups] == [
        ("g0", 1.0, None, 1), ("g1", 0.25, "stale", 3)]
    assert batch.metrics.down_weighted == {"stale": 1}
    flat = batch.metrics.as_dict()
    assert flat["buffer/down_weighted/stale"] == 1 and flat["buffer/staleness/3"] == 1 and flat["buffer/groups"] == 2


def test_ingest_lag_is_reported_from_commit_to_ingest(store):
    commit(store, "a", [make_group("g0"), make_group("g1")], at=100)  # both in one segment created at 100
    buffer = Buffer(store, config(batch_groups=2), clock=lambda: 112.5)
    buffer.poll()
    metrics = buffer.next_batch(0).metrics
    assert (metrics.ingest_lag_s_mean, metrics.ingest_lag_s_max) == (12.5, 12.5)


def test_state_restores_exactly_once_while_segments_keep_arriving(store_url):
    store = open_store(store_url)
    writers = {name: SegmentWriter(store, name, groups_per_segment=3) for name in ("a", "b", "c")}
    committed: list[str] = []
    trained: list[str] = []
    dropped: list[str] = []
    buffer = Buffer(store, config(batch_groups=4, staleness={"max_staleness": 3}))
    version = 0
    for round_ in range(12):
        for offset, (name, writer) in enumerate(writers.items()):
            for k in range(1 + (round_ + offset) % 3):
                group_id = f"{name}-{round_}-{k}"
                rewards = (1.0, 1.0) if (round_ + k) % 5 == 0 else (0.0, 1.0)
                writer.add(make_group(group_id, version=max(0, version - (round_ + k) % 6), rewards=rewards))
                committed.append(group_id)
        if round_ == 11:
            for writer in writers.values():
                writer.flush()
        buffer.poll()
        batch = buffer.next_batch(version, partial=round_ == 11)
        if batch is None:
            dropped += [d.group_id for d in buffer.resolve_drops(version)]  # as a waiting trainer does
            continue
        trained += ids(batch)
        dropped += [d.group_id for d in batch.dropped]
        version += 1
        # Crash after every other batch: a new buffer continues from the batch's state; every
        # third time the state goes through msgpack bytes, as a checkpoint file would hold it.
        if round_ % 2:
            state = batch.state.to_bytes() if round_ % 3 == 0 else msgspec.to_builtins(batch.state)
            buffer = Buffer(open_store(store_url), config(batch_groups=4, staleness={"max_staleness": 3}))
            buffer.restore(state)
    while (batch := buffer.next_batch(version, partial=True)) is not None and (batch.groups or batch.dropped):
        trained += ids(batch)
        dropped += [d.group_id for d in batch.dropped]
        version += 1
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    assert not set(trained) & set(dropped)
    assert sorted(trained + dropped) == sorted(committed), "a committed group was lost"
    assert dropped, "the data was built to exercise drops"


def test_resolved_segments_are_not_downloaded_again(store, monkeypatch):
    commit(store, "a", [make_group(f"g{i}") for i in range(6)], at=1, per_segment=2)
    buffer = Buffer(store, config(batch_groups=3))
    buffer.poll()
    state = buffer.next_batch(0).state  # g0..g2: segment 0 complete, segment 1 half done
    assert state.producers["a"].watermark == 1 and state.producers["a"].partial == {1: [0]}
    fetched = []
    restored = Buffer(store, config(batch_groups=3))
    original = restored._fetch_one
    monkeypatch.setattr(restored, "_fetch_one", lambda key: fetched.append(key) or original(key))
    restored.restore(state)
    assert restored.poll() == 3
    assert fetched == [segment_key("rollouts", "a", 1), segment_key("rollouts", "a", 2)]
    assert ids(restored.next_batch(0)) == ["g3", "g4", "g5"]
    assert restored.state().producers["a"].watermark == 3 and restored.state().producers["a"].partial == {}


def test_pruning_deletes_only_segments_below_the_watermarks_and_the_buffer_continues(store):
    commit(store, "a", [make_group(f"a{i}") for i in range(6)], at=1, per_segment=2)
    commit(store, "b", [make_group(f"b{i}") for i in range(2)], at=100, per_segment=2)
    buffer = Buffer(store, config(batch_groups=3))
    buffer.poll()
    state = buffer.next_batch(0).state  # a0..a2: a's segment 0 complete, segment 1 half done
    assert prune_segments(store, state) == 1
    assert store.list("rollouts/") == [segment_key("rollouts", "a", 1), segment_key("rollouts", "a", 2),
                                       segment_key("rollouts", "b", 0)]
    assert prune_segments(store, state) == 0
    restored = Buffer(store, config(batch_groups=5))
    restored.restore(state)
    restored.poll()
    assert ids(restored.next_batch(0)) == ["a3", "a4", "a5", "b0", "b1"]


def test_bounded_ingest_leaves_segments_in_the_store(store):
    commit(store, "a", [make_group(f"g{i}") for i in range(8)], at=1, per_segment=2)
    buffer = Buffer(store, config(batch_groups=2, max_pending_groups=3, ingest_threads=1))
    assert buffer.poll() == 4  # stops once 3 or more groups wait
    buffer.next_batch(0)
    buffer.next_batch(0)
    assert buffer.poll() == 4 and buffer.pending == 4


def test_a_corrupt_segment_raises_naming_it_and_changes_nothing(store):
    commit(store, "a", [make_group("g0"), make_group("g1")], at=1)
    key = segment_key("rollouts", "b", 0)
    store.put(key, b"not zstd at all")
    buffer = Buffer(store, config(batch_groups=2))
    with pytest.raises(WireError, match="rollouts/b/000000000000.seg"):
        buffer.poll()
    assert buffer.state() == BufferState()


def test_a_segment_whose_content_contradicts_its_name_is_refused(store):
    segment = wire.RolloutSegment(producer_id="a", sequence=3, groups=[make_group("g")])
    store.put(segment_key("rollouts", "a", 0), codec.encode_compressed(segment))
    with pytest.raises(WireError, match="sequence 3.*'a' 0"):
        Buffer(store).poll()


def test_a_torn_object_is_caught_by_its_checksum(tmp_path):
    store = open_store(f"file://{tmp_path}/bus")
    commit(store, "a", [make_group("g0")], at=1)
    path = tmp_path / "bus" / segment_key("rollouts", "a", 0)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match="000000000000.seg"):
        Buffer(store).poll()


def test_restore_refuses_a_newer_state_version_and_bad_input():
    buffer = Buffer(open_store("memory://relayrl-buffer-tests/state"))
    with pytest.raises(WireError, match="state version 99"):
        buffer.restore({"state_version": 99})
    with pytest.raises(WireError, match="buffer state: invalid"):
        buffer.restore({"producers": {"a": {"watermark": "x"}}})


def test_empty_segments_complete_at_once(store):
    store.put(segment_key("rollouts", "a", 0), codec.encode_compressed(
        wire.RolloutSegment(producer_id="a", sequence=0, groups=[])))
    commit(store, "a", [make_group("g0")], at=1)
    buffer = Buffer(store, config(batch_groups=1))
    buffer.poll()
    assert buffer.next_batch(0).state.producers["a"].watermark == 2


def test_wait_for_batch_times_out_with_none(store):
    buffer = Buffer(store, config(poll_interval_s=0.01))
    assert buffer.wait_for_batch(0, timeout_s=0.0) is None
    commit(store, "a", [make_group(f"g{i}") for i in range(16)], at=1)
    assert len(buffer.wait_for_batch(0, timeout_s=0.0)) == 16


def test_config_section_is_registered_and_validated():
    from relayrl.core.config import load_config
    from relayrl.core.errors import ConfigError

    loaded = load_config({"buffer": {"batch_groups": 8, "staleness": {"max_staleness": 0}}})
    assert loaded.buffer.batch_groups == 8 and loaded.buffer.staleness == StalenessSection(max_staleness=0)
    with pytest.raises(ConfigError, match="buffer.staleness.max_stalenes: unknown key; did you mean max_staleness"):
        load_config({"buffer": {"staleness": {"max_stalenes": 1}}})
    with pytest.raises(ConfigError, match="buffer.staleness.action"):
        load_config({"buffer": {"staleness": {"action": "ignore"}}})
