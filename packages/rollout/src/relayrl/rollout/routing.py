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
from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine, StreamEvent, collect_span

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


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[StreamEvent]) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    """``stream``, closed (``aclose``, which an engine's async-generator ``stream`` has) when the block
    ends, even when its consumer stopped before the stream's end."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)  # an AsyncIterator need not be a generator
        if close is not None:
            await close()


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
        tried: set[str] = set()
        for attempt in range(self.retries + 1):
            engine = self.pick(exclude=tried)
            tried.add(engine.engine_id)
            started = False
            self.in_flight[engine.engine_id] += 1
            try:
                # A consumer that stops at the last event closes this stream, and with it the engine's, at
                # once: the in-flight count and the engine's connection are released now, not whenever
                # the abandoned generators are collected (until then least-loaded saw a busy engine).
                async with closing(engine.stream(request)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except EngineDied:
                self.mark_down(engine)
                if started or attempt == self.retries:
                    raise
            finally:
                self.in_flight[engine.engine_id] -= 1

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
    """Records a generation token by token and resumes it elsewhere when its engine dies."""

    def __init__(self, engine: InferenceEngine, *, max_resumes: int = 3) -> None:
        self.engine = engine
        self.max_resumes = max_resumes

    async def generate(self, request: GenerateRequest, *,
                       on_event: Callable[[StreamEvent], None] | None = None) -> ProxyResult:
        events: list[StreamEvent] = []
        generated: list[int] = []
        engines: list[str] = []
        current = request
        for resumes in itertools.count():
            try:
                async with closing(self.engine.stream(current)) as stream:
                    async for event in stream:
                        if resumes and event.routing is not None:
                            # Same positions (the resumed prompt starts where the first did), but the
                            # span's first generated token is the original request's.
                            event = msgspec.structs.replace(event, routing=msgspec.structs.replace(
                                event.routing, first_generated=len(request.prompt)))
                        events.append(event)
                        generated += event.tokens
                        if event.tokens and (not engines or engines[-1] != event.engine_id):
                            engines.append(event.engine_id)
                        if on_event is not None:
                            on_event(event)
                        if event.finish_reason is not None:
                            return ProxyResult(span=collect_span(events), engine_ids=engines, resumes=resumes)
                raise EngineDied(f"request {current.request_id}: stream ended without a finish reason")
            except EngineDied:
                if resumes >= self.max_resumes:
                    raise
                remaining = request.params.max_tokens - len(generated)
                if remaining <= 0:
                    events.append(StreamEvent(finish_reason="length"))
                    return ProxyResult(span=collect_span(events), engine_ids=engines, resumes=resumes)
                seed = request.params.seed
                params = msgspec.structs.replace(
                    request.params, max_tokens=remaining,
                    seed=None if seed is None else (seed * 1_000_003 + len(generated)) % 2**63,
                    routing_from=_routing_resume_position(request, events))
                current = GenerateRequest(request_id=f"{request.request_id}/resume-{resumes + 1}",
                                          prompt=[*request.prompt, *generated], params=params)
        raise AssertionError("unreachable")


def _routing_resume_position(request: GenerateRequest, events: list[StreamEvent]) -> int | None:
    """Where a resumed request's routing record must start: right after what the dead engine recorded
    (the resumed prompt re-feeds the tokens generated so far, so the new engine routes them again)."""
    if request.params.routing_from is None:
        return None
    recorded = [event.routing for event in events if event.routing is not None and len(event.routing)]
    return recorded[-1].end if recorded else request.params.routing_from
