"""Wire schemas: hypothesis round trips, validation, schema versioning."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.core import codec, wire
from relayrl.core.arrays import pack_u32, run_length_decode, run_length_encode
from relayrl.core.errors import WireError

token = st.integers(min_value=0, max_value=2**32 - 1)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
text = st.text(max_size=20)
json_value = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite32 | text,
                          lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
                          max_leaves=8)


@st.composite
def spans(draw):
    n = draw(st.integers(0, 40))
    tokens = draw(st.lists(token, min_size=n, max_size=n))
    logprobs = draw(st.lists(st.floats(-50, 0, width=32), min_size=n, max_size=n))
    versions = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n).map(sorted))
    kept = None
    if draw(st.booleans()):
        # Each kept-set contains its token, or is empty (= untruncated).
        kept = [([t, *draw(st.lists(token, max_size=4))]) if draw(st.booleans()) else [] for t in tokens]
    return wire.GeneratedSpan.build(tokens, logprobs, versions, kept=kept, engine_id=draw(text),
                                    finish_reason=draw(st.sampled_from(["", "stop", "length"])))


tool_calls = st.builds(wire.ToolCall, id=text, name=text, arguments=st.dictionaries(text, json_value, max_size=3))
tool_results = st.builds(wire.ToolResult, call_id=text, output=text, exit_status=st.integers(-255, 255),
                         wall_time_s=st.floats(0, 1e6), truncated=st.booleans(), error=st.none() | text)
turns = st.builds(wire.Turn, role=st.sampled_from(["system", "user", "assistant", "tool"]),
                  tokens=st.lists(token, max_size=20).map(pack_u32), generated=st.none() | spans(), text=text,
                  tool_calls=st.lists(tool_calls, max_size=3), tool_results=st.lists(tool_results, max_size=3))
segments = st.builds(wire.TrajectorySegment, turns=st.lists(turns, max_size=4),
                     reason=st.sampled_from(["start", "compaction"]), summary=text)
trajectories = st.builds(
    wire.Trajectory, trajectory_id=text, task_id=text, group_id=text, sample_index=st.integers(0, 64),
    segments=st.lists(segments, min_size=1, max_size=3), reward=st.floats(-10, 10),
    reward_components=st.dictionaries(text, st.floats(-10, 10), max_size=3),
    cheating=st.lists(st.builds(wire.CheatingFlag, detector=text, evidence=text,
                                segment=st.none() | st.integers(0, 3), turn=st.none() | st.integers(0, 9)), max_size=2),
    timings=st.builds(wire.Timings, started_at=st.floats(0, 2e9), finished_at=st.floats(0, 2e9)),
    engine_ids=st.lists(text, max_size=3), status=st.sampled_from(["ok", "error"]), error=st.none() | text,
)
groups = st.builds(wire.Group, group_id=text, task_id=text, trajectories=st.lists(trajectories, max_size=3),
                   created_at=st.floats(0, 2e9), metadata=st.dictionaries(text, text, max_size=2))
rollout_segments = st.builds(wire.RolloutSegment, producer_id=text, sequence=st.integers(0, 2**40),
                             groups=st.lists(groups, max_size=2))
tensor_entries = st.builds(wire.TensorEntry, name=text, dtype=st.sampled_from(["bfloat16", "float32"]),
                           shape=st.lists(st.integers(1, 4096), max_size=3), object_key=text,
                           offset=st.integers(0, 2**40), length=st.integers(0, 2**40),
                           codec=st.sampled_from(["raw", "xor-zstd"]), checksum=st.text("0123456789abcdef", max_size=16))
manifests = st.builds(wire.WeightManifest, version=st.integers(0, 10**6), parent=st.none() | st.integers(0, 10**6),
                      kind=st.sampled_from(["full", "delta"]), tensors=st.lists(tensor_entries, max_size=4),
                      snapshot=st.none() | st.integers(0, 10**6), step=st.integers(0, 10**6))
task_specs = st.builds(wire.TaskSpec, task_id=text, instruction=text, kind=text, workspace=text, hidden_tests=text,
                       grading_command=text, gold_patch=st.none() | text, reference_globs=st.lists(text, max_size=3),
                       answer=json_value, metadata=st.dictionaries(text, json_value, max_size=3))
events = st.builds(wire.RunEvent, time=st.floats(0, 2e9), source=text, kind=text,
                   level=st.sampled_from(["debug", "info", "warning", "error"]), message=text,
                   data=st.dictionaries(text, json_value, max_size=3))


def _same(a, b) -> bool:
    # NaN-free by construction; compare via builtins so float32 packing is already applied.
    return msgspec.to_builtins(a) == msgspec.to_builtins(b)


@pytest.mark.parametrize("strategy, type_", [
    (rollout_segments, wire.RolloutSegment), (manifests, wire.WeightManifest), (task_specs, wire.TaskSpec),
    (events, wire.RunEvent), (trajectories, wire.Trajectory),
], ids=["segment", "manifest", "task", "event", "trajectory"])
def test_round_trip(strategy, type_):
    @settings(max_examples=60, deadline=None)
    @given(strategy)
    def check(message):
        assert _same(codec.decode(codec.encode(message), type_), message)
        assert _same(codec.decode_compressed(codec.encode_compressed(message), type_), message)

    check()


@given(spans())
@settings(max_examples=100, deadline=None)
def test_span_accessors_match_inputs(span):
    span.check()
    again = codec.decode(codec.encode(span), wire.GeneratedSpan)
    assert list(again.token_ids()) == list(span.token_ids())
    assert len(again.token_versions()) == len(again)
    for i in range(len(span)):
        kept = span.kept_set(i)
        assert kept == [] or span.token_ids()[i] in kept


def test_span_build_packs_exactly():
    span = wire.GeneratedSpan.build([7, 8, 9], [-0.5, -1.25, 0.0], [3, 3, 4], kept=[[7, 1], [8], []])
    assert span.tokens == b"\x07\x00\x00\x00\x08\x00\x00\x00\x09\x00\x00\x00"
    assert list(span.token_logprobs()) == [-0.5, -1.25, 0.0]
    assert span.versions == [(3, 2), (4, 1)]
    assert span.kept_csr() == (pack_u32_list([0, 2, 3, 3]), pack_u32_list([7, 1, 8]))
    assert span.kept_set(0) == [7, 1] and span.kept_set(1) == [8] and span.kept_set(2) == []
    csr = wire.GeneratedSpan.build([7, 8, 9], [-0.5, -1.25, 0.0], 3, kept_csr=([0, 2, 3, 3], [7, 1, 8]))
    assert csr.kept_ids == span.kept_ids and csr.versions == [(3, 3)]


def pack_u32_list(values):
    from relayrl.core.arrays import unpack_u32

    return unpack_u32(pack_u32(values))


@pytest.mark.parametrize("fields, message", [
    ({"tokens": pack_u32([1, 2]), "logprobs": b"\x00" * 4, "versions": [(0, 2)]}, "2 tokens but 1 logprobs"),
    ({"tokens": pack_u32([1]), "logprobs": b"\x00" * 4, "versions": [(0, 2)]}, "versions cover 2"),
    ({"tokens": pack_u32([1]), "logprobs": b"\x00" * 4, "versions": [(0, 1)], "kept_offsets": pack_u32([0])},
     "need 2 kept offsets"),
    ({"tokens": pack_u32([1]), "logprobs": b"\x00" * 4, "versions": [(0, 1)], "kept_offsets": pack_u32([0, 2]),
      "kept_ids": pack_u32([1])}, "last kept offset 2"),
    ({"tokens": b"\x00" * 3, "logprobs": b"", "versions": []}, "whole number of 4-byte items"),
])
def test_inconsistent_spans_are_refused_on_decode(fields, message):
    blob = msgspec.msgpack.encode(fields)
    with pytest.raises(WireError, match=message):
        codec.decode(blob, wire.GeneratedSpan, what="rollouts/seg-1")


def test_check_finds_token_outside_its_kept_set():
    span = wire.GeneratedSpan.build([5], [-1.0], 0, kept=[[6, 7]])
    with pytest.raises(ValueError, match="not in its own kept-set"):
        span.check()


def test_newer_schema_is_refused_naming_the_object():
    event = wire.RunEvent(time=1.0, source="trainer", kind="started", schema_version=wire.SCHEMA_VERSION + 1)
    with pytest.raises(WireError, match=r"events/1 \(RunEvent\): written with schema version 2"):
        codec.decode(codec.encode(event), wire.RunEvent, what="events/1")


def test_unknown_fields_from_newer_writers_are_ignored():
    data = msgspec.msgpack.encode({"time": 1.0, "source": "s", "kind": "k", "added_later": [1, 2]})
    assert codec.decode(data, wire.RunEvent).kind == "k"


def test_missing_required_field_is_named():
    with pytest.raises(WireError, match="missing required field `kind`"):
        codec.decode(msgspec.msgpack.encode({"time": 1.0, "source": "s"}), wire.RunEvent)


def test_garbage_bytes_are_refused():
    with pytest.raises(WireError, match="not a valid zstd frame"):
        codec.decode_compressed(b"not zstd at all", wire.RolloutSegment, what="rollouts/x")
    with pytest.raises(WireError, match="RunEvent"):
        codec.decode(b"\xc1", wire.RunEvent)


def test_trajectory_derived_costs():
    span = wire.GeneratedSpan.build([1, 2, 3], [-0.1] * 3, [4, 5, 5])
    segment = wire.TrajectorySegment(turns=[
        wire.Turn(role="user", tokens=pack_u32([9, 9])),
        wire.Turn(role="assistant", generated=span, tool_calls=[wire.ToolCall(id="1", name="bash")]),
        wire.Turn(role="tool", tool_results=[wire.ToolResult(call_id="1", wall_time_s=1.5)]),
        wire.Turn(role="assistant", generated=wire.GeneratedSpan.build([4], [-0.2], 6)),
    ])
    trajectory = wire.Trajectory(trajectory_id="t", task_id="task", group_id="g", sample_index=0,
                                 segments=[segment, wire.TrajectorySegment(turns=[], reason="compaction")])
    assert trajectory.num_generated_tokens == 4
    assert trajectory.num_turns == 2
    assert math.isclose(trajectory.tool_seconds, 1.5)
    assert trajectory.policy_version_range() == (4, 6)


def test_run_length_round_trip():
    assert run_length_encode([5, 5, 5, 6]) == [(5, 3), (6, 1)]
    assert run_length_decode([(5, 3), (6, 1)]) == [5, 5, 5, 6]
    assert run_length_encode([]) == []


# ------------------------------------------------------------------------------ expert routing
def routing(start: int, positions: int, *, layers: int = 3, top_k: int = 2, first_generated: int = 10,
            width: int = 1) -> wire.ExpertRouting:
    ids = bytes((start + i) % 251 for i in range(positions * layers * top_k * width))
    return wire.ExpertRouting(start=start, first_generated=first_generated, layers=layers, top_k=top_k, width=width,
                              experts=ids)


def test_a_span_with_routing_round_trips_through_a_compressed_segment():
    span = wire.GeneratedSpan.build([5, 6, 7], [-0.1, -0.2, -0.3], 4, routing=routing(0, 12))
    turn = wire.Turn(role="assistant", generated=span)
    trajectory = wire.Trajectory(trajectory_id="t", task_id="k", group_id="g", sample_index=0,
                                 segments=[wire.TrajectorySegment(turns=[turn])])
    segment = wire.RolloutSegment(producer_id="p", sequence=0, groups=[wire.Group(group_id="g", task_id="k",
                                                                                    trajectories=[trajectory])])
    decoded = codec.decode_compressed(codec.encode_compressed(segment), wire.RolloutSegment)
    record = decoded.groups[0].trajectories[0].segments[0].turns[0].generated.routing
    assert record == span.routing and len(record) == 12 and record.end == 12


def test_routing_parts_concatenate_only_when_they_tile_one_run_of_positions():
    whole = wire.ExpertRouting.concat([routing(0, 4), routing(4, 1), routing(5, 2)])
    assert (whole.start, len(whole)) == (0, 7)
    assert whole.experts == routing(0, 4).experts + routing(4, 1).experts + routing(5, 2).experts
    assert wire.ExpertRouting.concat([]) is None
    assert wire.ExpertRouting.concat([routing(0, 4), routing(5, 2)]) is None  # a gap
    assert wire.ExpertRouting.concat([routing(0, 4), routing(4, 2, layers=2)]) is None  # another layout
    assert wire.ExpertRouting.concat([routing(0, 4), routing(4, 2, first_generated=11)]) is None  # another prompt


@pytest.mark.parametrize("fields, message", [
    ({"experts": b"\0" * 7}, "whole positions"),
    ({"width": 3}, "1 or 2 bytes"),
    ({"layers": 0}, "bad routing record"),
    ({"format": 2}, "newer than this code reads"),
])
def test_malformed_routing_records_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        wire.ExpertRouting(**{"start": 0, "first_generated": 1, "layers": 3, "top_k": 2, **fields})


def test_routing_past_the_spans_last_token_is_refused():
    # A span of 3 tokens after a 10-token prompt: positions 0..12 exist.
    wire.GeneratedSpan.build([5, 6, 7], [0.0] * 3, 0, routing=routing(0, 13))
    with pytest.raises(ValueError, match="past the span's last token"):
        wire.GeneratedSpan.build([5, 6, 7], [0.0] * 3, 0, routing=routing(0, 14))
