"""LoopThread: events produced on a loop of its own reach callers on any loop, errors too."""

from __future__ import annotations

import asyncio

import pytest

from relayrl.rollout.loop_thread import LoopThread
from relayrl.rollout.protocol import StreamEvent


def test_events_reach_callers_on_different_loops_and_errors_are_raised_there():
    thread = LoopThread("test-loop")
    started: list[asyncio.AbstractEventLoop] = []

    async def produce(emit, count=3):
        started.append(asyncio.get_running_loop())
        for index in range(count):
            emit(StreamEvent(tokens=[index], finish_reason="length" if index == count - 1 else None))

    async def consume():
        return [event.tokens[0] async for event in thread.stream(produce)]

    assert asyncio.run(consume()) == [0, 1, 2] and asyncio.run(consume()) == [0, 1, 2]  # two caller loops
    assert started == [thread.loop, thread.loop]

    async def failing(emit):
        emit(StreamEvent(tokens=[9]))
        emit(ValueError("bad request"))

    async def consume_failing():
        return [event async for event in thread.stream(failing)]

    with pytest.raises(ValueError, match="bad request"):
        asyncio.run(consume_failing())
    assert thread.call(asyncio.sleep(0, result="done")) == "done"
    thread.stop()
    assert not thread.alive


def test_a_consumer_that_stops_early_cancels_the_producer():
    thread = LoopThread("test-loop")
    cancelled = asyncio.Event()

    async def endless(emit):
        try:
            while True:
                emit(StreamEvent(tokens=[1]))
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def take_two():
        stream = thread.stream(endless)
        events = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return events

    assert len(asyncio.run(take_two())) == 2
    thread.call(asyncio.wait_for(cancelled.wait(), 5))
    thread.stop()
