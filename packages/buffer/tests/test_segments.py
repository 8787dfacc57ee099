"""Producer side on local files and on S3: names, idempotent retried commits, restarts without collision."""

from __future__ import annotations

import pytest

from relayrl.buffer.segments import SegmentConflict, SegmentWriter, check_producer_id, parse_segment_key, segment_key
from relayrl.buffer.testing import make_group
from relayrl.core import codec, wire
from relayrl.core.errors import ObjectExists
from relayrl.core.store import open_store


def committed_groups(store, prefix="rollouts"):
    out = []
    for key in store.list(f"{prefix}/"):
        segment = codec.decode_compressed(store.get(key), wire.RolloutSegment)
        assert parse_segment_key(prefix, key) == (segment.producer_id, segment.sequence)
        out += [group.group_id for group in segment.groups]
    return out


def test_segment_names_round_trip_and_sort_numerically():
    keys = [segment_key("rollouts", "rollout-7", sequence) for sequence in (0, 9, 10, 123456)]
    assert keys == sorted(keys)
    assert keys[1] == "rollouts/rollout-7/000000000009.seg"
    assert [parse_segment_key("rollouts", key) for key in keys] == [("rollout-7", s) for s in (0, 9, 10, 123456)]
    for other in ["rollouts/rollout-7/9.seg", "rollouts/a/b/000000000001.seg", "weights/x/000000000001.seg",
                  "rollouts/rollout-7/000000000001.tmp"]:
        assert parse_segment_key("rollouts", other) is None


@pytest.mark.parametrize("bad", ["", "a/b", "-x", "has space", "x" * 129])
def test_bad_producer_ids_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="producer id"):
        check_producer_id(bad)


def test_writer_takes_prefix_and_segment_size_from_the_config(store):
    from relayrl.buffer.config import BufferSection

    writer = SegmentWriter.from_config(store, "rollout-3", BufferSection(prefix="runs/r1/rollouts", groups_per_segment=1))
    assert writer.add(make_group("g")) == "runs/r1/rollouts/rollout-3/000000000000.seg"


def test_writer_commits_every_n_groups_and_flushes_the_rest(store):
    writer = SegmentWriter(store, "rollout-0", groups_per_segment=2)
    keys = [writer.add(make_group(f"g{index}")) for index in range(5)]
    assert keys[0] is None and keys[1] == "rollouts/rollout-0/000000000000.seg" and keys[3] is not None
    assert writer.pending_groups == 1
    assert writer.flush() == "rollouts/rollout-0/000000000002.seg"
    assert writer.flush() is None
    assert committed_groups(store) == [f"g{index}" for index in range(5)]


def test_a_dead_producer_loses_only_its_uncommitted_groups_and_its_successor_resumes(store):
    first = SegmentWriter(store, "rollout-0", groups_per_segment=2)
    for index in range(5):
        first.add(make_group(f"first-{index}"))
    del first  # dies with one group queued
    second = SegmentWriter(open_store(store.url), "rollout-0", groups_per_segment=2)
    assert second.next_sequence == 2
    for index in range(2):
        second.add(make_group(f"second-{index}"))
    assert store.list("rollouts/") == [f"rollouts/rollout-0/{s:012d}.seg" for s in range(3)]
    assert committed_groups(store) == ["first-0", "first-1", "first-2", "first-3", "second-0", "second-1"]


def test_a_retried_commit_whose_first_attempt_landed_succeeds_once(store):
    writer = SegmentWriter(store, "rollout-0")
    key = segment_key("rollouts", "rollout-0", 0)
    data = codec.encode_compressed(wire.RolloutSegment(producer_id="rollout-0", sequence=0, groups=[make_group("g")]))
    # The first attempt lands but its reply is lost; the retry finds the very same bytes.
    assert writer._put_once(key, data)
    assert writer._put_once(key, data)
    assert store.get(key) == data
    with pytest.raises(ObjectExists):
        store.put(key, b"other", if_absent=True)
    assert not writer._put_once(key, b"someone else's bytes")


def test_two_live_writers_with_one_id_never_overwrite_each_other(store):
    # A zombie of the previous life still commits while its successor starts.
    zombie = SegmentWriter(store, "rollout-0", groups_per_segment=1)
    successor = SegmentWriter(open_store(store.url), "rollout-0", groups_per_segment=1)
    assert zombie.next_sequence == successor.next_sequence == 0
    zombie.add(make_group("zombie-0"))
    successor.add(make_group("successor-0"))  # collides on sequence 0, moves on
    zombie.add(make_group("zombie-1"))        # collides on sequence 1, moves on
    assert sorted(committed_groups(store)) == ["successor-0", "zombie-0", "zombie-1"]
    assert successor.committed == ["rollouts/rollout-0/000000000001.seg"]


def test_endless_collisions_raise_naming_the_producer(store, monkeypatch):
    writer = SegmentWriter(store, "rollout-0")
    monkeypatch.setattr(writer, "_put_once", lambda key, data: False)
    with pytest.raises(SegmentConflict, match="'rollout-0'.*same id"):
        writer.commit([make_group("g")])


def test_created_at_never_runs_backwards_within_a_producer(store):
    times = iter([100.0, 50.0, 120.0])
    writer = SegmentWriter(store, "rollout-0", groups_per_segment=1, clock=lambda: next(times))
    for index in range(3):
        writer.add(make_group(f"g{index}"))
    stamps = [codec.decode_compressed(store.get(key), wire.RolloutSegment).created_at for key in writer.committed]
    assert stamps == [100.0, 100.0, 120.0]
