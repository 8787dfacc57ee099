"""The cursor under any resolution order: watermarks, sparse sets, and state round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.buffer.cursor import BufferState, Cursor
from relayrl.buffer.segments import GroupRef


@st.composite
def resolution_orders(draw):
    """Segment sizes of two producers and an order in which a prefix of their groups resolves."""
    sizes = {producer: draw(st.lists(st.integers(1, 4), min_size=1, max_size=6)) for producer in ("a", "b")}
    refs = [GroupRef(producer, sequence, index) for producer, counts in sizes.items()
            for sequence, count in enumerate(counts) for index in range(count)]
    order = draw(st.permutations(refs))
    resolved = draw(st.integers(0, len(order)))
    checkpoint = draw(st.integers(0, resolved))
    return sizes, order[:resolved], checkpoint


@settings(max_examples=200, deadline=None)
@given(resolution_orders())
def test_cursor_knows_exactly_what_was_resolved_across_a_state_round_trip(case):
    sizes, order, checkpoint = case
    cursor = Cursor()
    for position, ref in enumerate(order):
        if position == checkpoint:  # a restart from a checkpoint in the middle
            cursor = Cursor.from_state(BufferState.coerce(BufferState(
                resolved_groups=cursor.resolved_groups, producers=cursor.to_states()).to_bytes()))
        cursor.resolve(ref, sizes[ref.producer_id][ref.sequence])
    done = set(order)
    assert cursor.resolved_groups == len(done)
    states = cursor.to_states()
    for producer, counts in sizes.items():
        complete = [all(GroupRef(producer, s, i) in done for i in range(count)) for s, count in enumerate(counts)]
        watermark = complete.index(False) if False in complete else len(counts)
        assert states.get(producer, None) is None or states[producer].watermark == watermark
        for sequence, count in enumerate(counts):
            assert cursor.segment_done(producer, sequence) == complete[sequence]
            for index in range(count):
                assert cursor.is_resolved(GroupRef(producer, sequence, index)) == (GroupRef(producer, sequence, index) in done)
        if producer in states:  # the sparse part holds only what the watermark does not cover
            assert all(s > watermark for s in states[producer].complete)
            assert all(s >= watermark for s in states[producer].partial)


def test_resolving_twice_is_a_loud_bug():
    cursor = Cursor()
    cursor.resolve(GroupRef("a", 0, 0), 2)
    with pytest.raises(ValueError, match="a/0/0 resolved twice"):
        cursor.resolve(GroupRef("a", 0, 0), 2)
