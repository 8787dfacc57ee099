"""``RouterTests``: the conformance suite for routers (the built-in one and the Dynamo plugin).

Override ``make_router(engines)``: given engines, return an :class:`InferenceEngine` that routes
requests over them. The suite drives it with small real torch engines, some wrapped so that they
fail on demand: before the first token (the router must retry elsewhere) or mid-stream (the router
must raise :class:`EngineDied` rather than hide lost tokens).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import (
    EngineDied,
    GenerateRequest,
    InferenceEngine,
    SamplingParams,
    StreamEvent,
    collect_span,
)
from relayrl.rollout.testing.models import tiny_llama


class FailingEngine(InferenceEngine):
    """Wraps an engine; fails the next ``fail_before_first`` requests at once, or mid-stream after N tokens."""

    def __init__(self, inner: InferenceEngine, *, fail_before_first: int = 0, fail_after_tokens: int | None = None):
        self.inner = inner
        self.engine_id = inner.engine_id
        self.fail_before_first = fail_before_first
        self.fail_after_tokens = fail_after_tokens
        self.calls = 0
        self.dead = False

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.dead or self.fail_before_first > 0:
            self.fail_before_first -= 1
            raise EngineDied(f"{self.engine_id} refused the connection")
        count = 0
        async for event in self.inner.stream(request):
            if self.fail_after_tokens is not None and count >= self.fail_after_tokens:
                self.dead = True
                raise EngineDied(f"{self.engine_id} died mid-stream")
            count += len(event.tokens)
            yield event

    async def health(self):
        return {"engine_id": self.engine_id, "alive": not self.dead}

    async def close(self) -> None:
        await self.inner.close()


def _engines(count: int) -> list[TorchEngine]:
    model = tiny_llama(seed=0)
    return [TorchEngine(model, engine_id=f"engine-{index}") for index in range(count)]


def _request(index: int, max_tokens: int = 6) -> GenerateRequest:
    return GenerateRequest(request_id=f"q{index}", prompt=[1, 2, 3], params=SamplingParams(max_tokens=max_tokens,
                                                                                           seed=index))


async def _generate_all(router: InferenceEngine, count: int):
    return await asyncio.gather(*(router.generate(_request(index)) for index in range(count)))


class RouterTests:
    """Conformance suite for routers."""

    @pytest.fixture
    def make_router(self):
        raise NotImplementedError("override `make_router`: engines -> a routing InferenceEngine")

    def test_requests_spread_over_all_engines(self, make_router) -> None:
        engines = _engines(3)
        router = make_router(engines)

        spans = asyncio.run(_generate_all(router, 9))
        used = {span.engine_id for span in spans}
        assert used == {"engine-0", "engine-1", "engine-2"}
        assert all(len(span) == 6 for span in spans)
        asyncio.run(router.close())

    def test_failure_before_the_first_token_is_retried_elsewhere(self, make_router) -> None:
        engines = _engines(2)
        flaky = FailingEngine(engines[0], fail_before_first=5)
        router = make_router([flaky, engines[1]])
        spans = asyncio.run(_generate_all(router, 4))
        assert all(span.engine_id == "engine-1" and len(span) == 6 for span in spans)
        assert flaky.calls >= 1
        asyncio.run(router.close())

    def test_failure_mid_stream_is_reported_not_hidden(self, make_router) -> None:
        engines = _engines(2)
        dying = FailingEngine(engines[0], fail_after_tokens=3)
        router = make_router([dying, FailingEngine(engines[1], fail_after_tokens=3)])
        with pytest.raises(EngineDied):
            asyncio.run(router.generate(_request(0, max_tokens=20)))
        asyncio.run(router.close())

    def test_a_group_call_gives_each_request_its_own_tokens(self, make_router) -> None:
        engines = _engines(2)
        router = make_router(engines)
        requests = [_request(index) for index in range(4)]

        async def grouped():
            events: dict[int, list[StreamEvent]] = {index: [] for index in range(len(requests))}
            async for index, event in router.stream_group(requests):
                events[index].append(event)
            return events

        events = asyncio.run(grouped())
        alone = [asyncio.run(router.generate(request)) for request in requests]
        for index in range(len(requests)):
            span = collect_span(events[index])
            assert list(span.token_ids()) == list(alone[index].token_ids()) and span.finish_reason == "length"
        asyncio.run(router.close())

    def test_dead_engines_are_skipped_after_a_failure(self, make_router) -> None:
        engines = _engines(2)
        dead = FailingEngine(engines[0], fail_before_first=10**6)
        router = make_router([dead, engines[1]])
        for index in range(6):
            assert asyncio.run(router.generate(_request(index))).engine_id == "engine-1"
        assert dead.calls <= 2  # tried, marked down, then left alone
        asyncio.run(router.close())
