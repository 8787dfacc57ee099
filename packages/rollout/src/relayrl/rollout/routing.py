"""Routers spread requests over engines; the token-recording proxy makes trajectories survive them.

A :class:`Router` is itself an :class:`InferenceEngine`: it picks an engine per request
(``round-robin`` or ``least-loaded`` by in-flight requests), skips engines that failed recently
until a health check finds them alive again, and retries a request on another engine when it fails
*before its first token*. A failure after tokens have streamed is not the router's to hide: it
raises :class:`EngineDied`, and the :class:`TokenRecordingProxy` resumes.

The proxy records every token event as it streams (ids, logprobs, versions, kept-sets, engine).
When the engine dies mid-generation it re-issues the request with the prompt plus the tokens
generated so far and the remaining budget, through the router, so the generation continues on
another engine and the recorded span stays token-exact: every token keeps the logprob, kept-set
and version of the engine that actually sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

import msgspec

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import GeneratedSpan
from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine, StreamEvent, closing, collect_span

__all__ = ["ProxyResult", "Router", "RouterConfig", "TokenRecordingProxy"]

Policy = Literal["round-robin", "least-loaded"]


class RouterConfig(Section):
    """``[rollout] router_options`` of the built-in routers (``round-robin``, ``least-loaded``)."""

    retries: int = 2
    """Other engines a request is retried on when its engine fails before the first token."""
    down_for_s: float = 2.0
    """How long an engine that failed is skipped before a health check may bring it back."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.retries < 0 or self.down_for_s < 0:
            raise ConfigError(f"{path}: retries and down_for_s must be at least 0 (got {self.retries}, {self.down_for_s})")


class Router(InferenceEngine):
    """Routes each request to one of ``engines`` (see the module docstring)."""

    def __init__(self, engines: Sequence[InferenceEngine], *, policy: Policy = "round-robin", retries: int = 2,
                 down_for_s: float = 2.0, engine_id: str = "router") -> None:
        if not engines:
            raise ValueError("a router needs at least one engine")
        if policy not in ("round-robin", "least-loaded"):
            raise ValueError(f"unknown routing policy {policy!r} (round-robin, least-loaded)")
        self.engines = list(engines)
        self.policy = policy
        self.retries = retries
        self.down_for_s = down_for_s
        self.engine_id = engine_id
        self.in_flight = {engine.engine_id: 0 for engine in self.engines}
        self._down_until: dict[str, float] = {}
        self._cycle = itertools.count()

    def _candidates(self) -> list[InferenceEngine]:
        now = time.monotonic()
        up = [engine for engine in self.engines if self._down_until.get(engine.engine_id, 0.0) <= now]
        return up or list(self.engines)  # all marked down: try anyway rather than fail without trying

    def pick(self, exclude: set[str] = frozenset()) -> InferenceEngine:
        """The engine the policy chooses next, avoiding ``exclude`` when possible."""
        candidates = [engine for engine in self._candidates() if engine.engine_id not in exclude] or self._candidates()
        if self.policy == "least-loaded":
            return min(candidates, key=lambda engine: (self.in_flight[engine.engine_id], self.engines.index(engine)))
        return candidates[next(self._cycle) % len(candidates)]

    def mark_down(self, engine: InferenceEngine) -> None:
        self._down_until[engine.engine_id] = time.monotonic() + self.down_for_s

    async def check_health(self) -> dict[str, bool]:
        """Ask every engine; dead ones are skipped until a later check finds them alive."""
        results = await asyncio.gather(*(engine.health() for engine in self.engines))
        alive = {}
        for engine, result in zip(self.engines, results):
            alive[engine.engine_id] = bool(result.get("alive"))
            if alive[engine.engine_id]:
                self._down_until.pop(engine.engine_id, None)
            else:
                self.mark_down(engine)
        return alive

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        async with closing(self._route(lambda engine: engine.stream(request), 1)) as events:
            async for event in events:
                yield event

    def stream_group(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[tuple[int, StreamEvent]]:
        """The whole group to one engine (one call there; its samples share their prompt's prefill),
        counted as ``len(requests)`` in flight."""
        return self._route(lambda engine: engine.stream_group(requests), len(requests))

    async def _route(self, open_stream: Callable[[InferenceEngine], AsyncIterator[Any]], load: int) -> AsyncIterator[Any]:
        """Stream from the engine the policy picks; retried elsewhere while nothing has streamed."""
        tried: set[str] = set()
        for attempt in range(self.retries + 1):
            engine = self.pick(exclude=tried)
            tried.add(engine.engine_id)
            started = False
            self.in_flight[engine.engine_id] += load
            try:
                # A consumer that stops at the last event closes this stream, and with it the engine's, at
                # once: the in-flight count and the engine's connection are released now, not whenever
                # the abandoned generators are collected (until then least-loaded saw a busy engine).
                async with closing(open_stream(engine)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except EngineDied:
                self.mark_down(engine)
                if started or attempt == self.retries:
                    raise
            finally:
                self.in_flight[engine.engine_id] -= load

    async def health(self) -> dict[str, Any]:
        alive = await self.check_health()
        return {"engine_id": self.engine_id, "alive": any(alive.values()), "engines": alive}

    async def close(self) -> None:
        await asyncio.gather(*(engine.close() for engine in self.engines))


class ProxyResult(msgspec.Struct, frozen=True, kw_only=True):
    span: GeneratedSpan
    engine_ids: list[str]
    """Every engine that contributed tokens, in order."""
    resumes: int
    """How many times the generation moved to another engine."""


class TokenRecordingProxy:
    """Records a generation token by token and resumes it elsewhere when its engine dies.

    Group calls: requests for the same prompt with the same sampling parameters (but their seeds)
    that reach :meth:`generate` in the same turn of the event loop (a group's samples, started
    together) go to the engine as one :meth:`~InferenceEngine.stream_group` call; each is still
    recorded, and resumed, on its own. ``group_calls=False`` sends every request alone.
    """

    def __init__(self, engine: InferenceEngine, *, max_resumes: int = 3, group_calls: bool = True) -> None:
        self.engine = engine
        self.max_resumes = max_resumes
        self.group_calls = group_calls
        self.group_calls_made = 0
        """Group calls sent (of more than one request)."""
        self._forming: dict[tuple[Any, ...], _Forming] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def generate(self, request: GenerateRequest, *,
                       on_event: Callable[[StreamEvent], None] | None = None) -> ProxyResult:
        """Generate ``request`` to its end (``on_event``: called with each event as it is recorded; such a
        request is sent alone)."""
        if on_event is not None or not self.group_calls:
            return await self._complete(_Recording(request), on_event)
        loop = asyncio.get_running_loop()
        key = (id(loop), tuple(request.prompt), _encode(msgspec.structs.replace(request.params, seed=None)))
        forming = self._forming.get(key)
        if forming is None:
            forming = self._forming[key] = _Forming()
            loop.call_soon(self._send, key)  # after the other requests started in this turn of the loop
        future: asyncio.Future[ProxyResult] = loop.create_future()
        forming.requests.append(request)
        forming.futures.append(future)
        return await future

    async def generate_group(self, requests: Sequence[GenerateRequest]) -> list[ProxyResult]:
        """Generate ``requests`` in one group call; the ones its engine's death cuts off resume alone."""
        recordings = [_Recording(request) for request in requests]
        with contextlib.suppress(EngineDied):
            async with closing(self.engine.stream_group(requests)) as stream:
                async for index, event in stream:
                    recordings[index].add(event)
        cut = [recording for recording in recordings if not recording.finished]
        if cut:
            if self.max_resumes < 1:
                raise EngineDied(f"group of {requests[0].request_id}: {len(cut)} request(s) cut off, no resumes allowed")
            for recording in cut:
                recording.resumes = 1
            resumed = [asyncio.ensure_future(self._complete(recording)) for recording in cut]
            try:
                await asyncio.gather(*resumed)  # the first failure (an EngineDied past max_resumes) is raised
            finally:
                for job in resumed:
                    job.cancel()
                await asyncio.gather(*resumed, return_exceptions=True)
        return [recording.result() for recording in recordings]

    async def _complete(self, recording: _Recording, on_event: Callable[[StreamEvent], None] | None = None) -> ProxyResult:
        """Stream ``recording``'s request (resumed after what it holds) until it finishes, resuming on
        another engine each time its engine dies."""
        while True:
            current = recording.next_request()
            if current is None:
                return recording.result()
            try:
                async with closing(self.engine.stream(current)) as stream:
                    async for event in stream:
                        recording.add(event)
                        if on_event is not None:
                            on_event(event)
                        if event.finish_reason is not None:
                            return recording.result()
                raise EngineDied(f"request {current.request_id}: stream ended without a finish reason")
            except EngineDied:
                if recording.resumes >= self.max_resumes:
                    raise
                recording.resumes += 1

    def _send(self, key: tuple[Any, ...]) -> None:
        """Send the requests formed under ``key``: alone, or as one group call."""
        forming = self._forming.pop(key)
        call = asyncio.ensure_future(self._serve(forming))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

        def abandoned(_: asyncio.Future[ProxyResult]) -> None:
            if all(future.cancelled() for future in forming.futures):  # nobody waits for any of them now
                call.cancel()

        for future in forming.futures:
            future.add_done_callback(abandoned)

    async def _serve(self, forming: _Forming) -> None:
        try:
            if len(forming.requests) == 1:
                results = [await self._complete(_Recording(forming.requests[0]))]
            else:
                self.group_calls_made += 1
                results = await self.generate_group(forming.requests)
        except asyncio.CancelledError:
            for future in forming.futures:
                future.cancel()
        except Exception as exc:  # every waiting caller gets it
            for future in forming.futures:
                if not future.done():
                    future.set_exception(exc)
        else:
            for future, result in zip(forming.futures, results):
                if not future.done():
                    future.set_result(result)


_encode = msgspec.json.Encoder().encode


class _Forming:
    """Requests that will go to the engine together, and their callers' futures."""

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.futures: list[asyncio.Future[ProxyResult]] = []


class _Recording:
    """Everything recorded of one request's generation, over the engines that served it."""

    def __init__(self, request: GenerateRequest) -> None:
        self.request = request
        self.events: list[StreamEvent] = []
        self.generated: list[int] = []
        self.engines: list[str] = []
        self.resumes = 0
        """How many times the generation moved (or is about to move) to another engine."""
        self.finished = False

    def add(self, event: StreamEvent) -> None:
        if self.resumes and event.routing is not None:
            # Same positions (the resumed prompt starts where the first did), but the span's first
            # generated token is the original request's.
            event = msgspec.structs.replace(event, routing=msgspec.structs.replace(
                event.routing, first_generated=len(self.request.prompt)))
        self.events.append(event)
        self.generated += event.tokens
        if event.tokens and (not self.engines or self.engines[-1] != event.engine_id):
            self.engines.append(event.engine_id)
        if event.finish_reason is not None:
            self.finished = True

    def next_request(self) -> GenerateRequest | None:
        """The request to send now: the original, or after a death its continuation (the prompt plus the
        tokens generated so far, the rest of the budget); None when the budget is spent (finished)."""
        if not self.resumes:
            return self.request
        request = self.request
        remaining = request.params.max_tokens - len(self.generated)
        if remaining <= 0:
            self.add(StreamEvent(finish_reason="length"))
            return None
        seed = request.params.seed
        params = msgspec.structs.replace(
            request.params, max_tokens=remaining,
            seed=None if seed is None else (seed * 1_000_003 + len(self.generated)) % 2**63,
            routing_from=_routing_resume_position(request, self.events))
        return GenerateRequest(request_id=f"{request.request_id}/resume-{self.resumes}",
                               prompt=[*request.prompt, *self.generated], params=params)

    def result(self) -> ProxyResult:
        return ProxyResult(span=collect_span(self.events), engine_ids=self.engines, resumes=self.resumes)


def _routing_resume_position(request: GenerateRequest, events: list[StreamEvent]) -> int | None:
    """Where a resumed request's routing record must start: right after what the dead engine recorded
    (the resumed prompt re-feeds the tokens generated so far, so the new engine routes them again)."""
    if request.params.routing_from is None:
        return None
    recorded = [event.routing for event in events if event.routing is not None and len(event.routing)]
    return recorded[-1].end if recorded else request.params.routing_from
