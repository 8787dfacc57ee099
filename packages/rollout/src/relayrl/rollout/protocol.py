"""The inference-engine protocol: token-level requests, streamed events, and weight-update hooks.

Everything here is token-level. A request carries prompt token ids and sampling parameters; an
engine streams :class:`StreamEvent`s, each with the tokens it sampled since the last event and,
for every token, its logprob under the truncated distribution actually sampled from, the policy
version of the weights that produced it, and its kept-set. :func:`collect_span` folds a stream
into a :class:`relayrl.core.wire.GeneratedSpan`, the record the trainer replays.

A group call (:meth:`InferenceEngine.stream_group`) carries several requests at once, a group's
samples of one prompt: one call (one HTTP request, one stream) instead of one per sample, and the
engine sees them together (the torch engine prefills their shared prompt once). Its events are
``(index, event)`` pairs, each index's events exactly those its request alone would stream.

An engine that takes weight updates while it serves says how, with :meth:`InferenceEngine.weight_adapter`:
relayrl-weight-sync's :class:`~relayrl.weight_sync.EngineAdapter`, the one protocol a weight
controller drives (weight-sync owns it).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from relayrl.core.wire import ExpertRouting, GeneratedSpan

if TYPE_CHECKING:
    from relayrl.weight_sync import EngineAdapter

__all__ = ["EngineDied", "GenerateRequest", "InferenceEngine", "SamplingParams", "StreamEvent", "closing",
           "collect_span", "merge_streams"]


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample; mirrors ``[algo.sampling]`` plus per-request limits."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_kept: int = 0
    """Cap on kept-set size; 0 = no cap."""
    stop_token_ids: list[int] = []
    seed: int | None = None
    """Per-request seed: the same request on the same weights samples the same tokens."""
    routing_from: int | None = None
    """Mixture-of-experts policies: record the experts every layer routed each position to, from
    this prompt position on (the prompt's earlier positions were recorded with an earlier request of
    the same context), and for every generated token fed back. None: record nothing. An engine
    whose model has no routers, or that cannot capture them, ignores it (no routing in its events)."""


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    prompt: list[int]
    params: SamplingParams = SamplingParams()


class StreamEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens sampled since the previous event (usually one), or the end of the stream."""

    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    kept: list[list[int]] = []
    """Kept-set of each token (``[]`` = the full vocabulary)."""
    engine_id: str = ""
    finish_reason: str | None = None
    """Set on the last event: ``stop`` (a stop token), ``length`` (max_tokens), ``abort``."""
    routing: ExpertRouting | None = None
    """The positions routed since the previous event (``SamplingParams.routing_from``): the prompt's
    with the first token, then the token fed back at each step."""


class EngineDied(RuntimeError):
    """The engine serving a stream went away (connection lost, process killed)."""


class InferenceEngine(abc.ABC):
    """Something that generates token streams: an engine, an engine server's client, a router.

    Implementations: the built-in torch engine, the HTTP client of an engine server, and plugins
    (vLLM). Every engine passes ``relayrl.rollout.testing.EngineTests``.
    """

    engine_id: str

    @abc.abstractmethod
    def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """Generate for ``request``, yielding events as tokens are sampled; the last has a finish reason.

        Raises :class:`EngineDied` if the engine goes away mid-stream.
        """

    def stream_group(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[tuple[int, StreamEvent]]:
        """Generate for several requests in one call, yielding ``(index into requests, event)`` as tokens
        are sampled; each index's events are what :meth:`stream` would yield for its request alone.

        Raises :class:`EngineDied` if the engine goes away: the requests whose last event was not
        yielded are the ones cut off (a caller resumes those). The default runs the requests' own
        streams concurrently; engines that can serve a group in one call override it.
        """
        return merge_streams([self.stream(request) for request in requests])

    async def generate(self, request: GenerateRequest) -> GeneratedSpan:
        """The whole generation as one span."""
        return collect_span([event async for event in self.stream(request)])

    async def health(self) -> dict[str, Any]:
        """Liveness and load: at least ``engine_id``, ``version`` and ``alive``."""
        return {"engine_id": self.engine_id, "alive": True}

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release resources (threads, sessions)."""

    def weight_adapter(self) -> EngineAdapter | None:
        """How a weight controller updates this engine in place while it serves; None (the default):
        it takes no weight updates (a client of a remote engine, a router).

        Engines whose weights are plain tensors return an adapter that writes them directly; engines
        that repack their weights implement :class:`~relayrl.weight_sync.WeightLoader` and return a
        :class:`~relayrl.weight_sync.ShadowAdapter` over themselves. Called once per controller.
        """
        return None


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``stream``, closed (``aclose``, which an engine's async-generator ``stream`` has) when the block
    ends, even when its consumer stopped before the stream's end."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)  # an AsyncIterator need not be a generator
        if close is not None:
            await close()


async def merge_streams(streams: Sequence[AsyncIterator[StreamEvent]]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Run ``streams`` concurrently, yielding ``(index, event)`` in arrival order.

    A stream that fails does not stop the others: once every other stream has ended, the first
    failure is raised (an :class:`EngineDied` then cuts off only the requests that did not finish).
    Closing the merged stream early closes every stream.
    """
    queue: asyncio.Queue[tuple[int, StreamEvent | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[StreamEvent]) -> None:
        try:
            async with closing(stream) as events:
                async for event in events:
                    queue.put_nowait((index, event))
        except Exception as exc:  # handed to the consumer, raised there
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    pumps = [asyncio.ensure_future(pump(index, stream)) for index, stream in enumerate(streams)]
    failure: BaseException | None = None
    try:
        running = len(pumps)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                failure = failure or item
            else:
                yield index, item
        if failure is not None:
            raise failure
    finally:
        for job in pumps:
            job.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def collect_span(events: Iterable[StreamEvent]) -> GeneratedSpan:
    """Fold a stream of events into one :class:`GeneratedSpan`."""
    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    kept: list[list[int]] = []
    engine_ids: dict[str, int] = {}
    routing: list[ExpertRouting] = []
    finish_reason = ""
    for event in events:
        tokens += event.tokens
        logprobs += event.logprobs
        versions += event.versions
        kept += event.kept
        if event.routing is not None:
            routing.append(event.routing)
        if event.tokens:
            engine_ids[event.engine_id] = engine_ids.get(event.engine_id, 0) + len(event.tokens)
        if event.finish_reason:
            finish_reason = event.finish_reason
    engine = max(engine_ids, key=engine_ids.__getitem__) if engine_ids else ""
    record_kept = any(kept)
    return GeneratedSpan.build(tokens, logprobs, versions, kept=kept if record_kept else None, engine_id=engine,
                               finish_reason=finish_reason, routing=ExpertRouting.concat(routing))
