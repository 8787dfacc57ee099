"""Serving an engine over HTTP, and the client that talks to such a server.

Endpoints (aiohttp):

``POST /generate``
    Body: a JSON :class:`GenerateRequest`. Response: newline-delimited JSON
    :class:`StreamEvent`s, written as the engine hands them over (one per token, or several tokens
    per event: the torch engine coalesces for a consumer that lags and, with ``stream_interval_s``,
    at most that often); the last one has ``finish_reason``. This is the token-level API the
    rollout side uses.
``POST /generate_group``
    Body: a JSON list of :class:`GenerateRequest` (a group's samples). Response: newline-delimited
    JSON ``[index, event]`` pairs, the events of all of them on one stream
    (:meth:`InferenceEngine.stream_group`).
``POST /v1/completions``
    OpenAI-compatible completions (``prompt`` as text or token ids, ``max_tokens``,
    ``temperature``, ``top_p``, ``seed``, ``stream``) for pointing other tools at an engine. Needs a
    tokenizer in the model directory for text prompts.
``GET /health``
    ``{"engine_id", "version", "alive", ...}``.

Run a server with ``python -m relayrl.rollout.engines.http --model DIR --port 0 [--engine vllm]``; it
prints ``READY <port>`` on stdout once it listens (and, with ``--router dynamo``, once it is
registered with the router's discovery), and stops cleanly on SIGTERM, deregistering first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine, SamplingParams, StreamEvent, closing

__all__ = ["HttpEngine", "build_app", "main"]

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(StreamEvent)
_request_decoder = msgspec.json.Decoder(GenerateRequest)
_group_decoder = msgspec.json.Decoder(list[GenerateRequest])
_group_event_decoder = msgspec.json.Decoder(tuple[int, StreamEvent])


def build_app(engine: InferenceEngine, *, tokenizer: Any = None, model_name: str = "relayrl",
              health_extra: Callable[[], dict[str, Any]] | None = None) -> web.Application:
    """An aiohttp application serving ``engine``; ``health_extra`` adds ``weight_sync`` to ``/health``."""
    app = web.Application()

    async def ndjson(request: web.Request, items: AsyncIterator[Any]) -> web.StreamResponse:
        """Write ``items`` to the response as newline-delimited JSON, as the engine hands them over."""
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async for item in items:
            await response.write(_encoder.encode(item) + b"\n")
        await response.write_eof()
        return response

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            payload = _request_decoder.decode(await request.read())
        except msgspec.DecodeError as exc:
            raise web.HTTPBadRequest(text=f"invalid generate request: {exc}") from None
        return await ndjson(request, engine.stream(payload))

    async def generate_group(request: web.Request) -> web.StreamResponse:
        try:
            payload = _group_decoder.decode(await request.read())
        except msgspec.DecodeError as exc:
            raise web.HTTPBadRequest(text=f"invalid generate_group request: {exc}") from None
        if not payload:
            raise web.HTTPBadRequest(text="generate_group: no requests")
        return await ndjson(request, engine.stream_group(payload))

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        if isinstance(prompt, str):
            if tokenizer is None:
                raise web.HTTPBadRequest(text="this engine has no tokenizer: send prompt as a list of token ids")
            prompt_ids = tokenizer.encode(prompt)
        else:
            prompt_ids = [int(token) for token in prompt]
        params = SamplingParams(max_tokens=int(body.get("max_tokens", 16)), temperature=float(body.get("temperature", 1.0)),
                                top_p=float(body.get("top_p", 1.0)), seed=body.get("seed"),
                                stop_token_ids=[tokenizer.eos_token_id] if tokenizer is not None and
                                tokenizer.eos_token_id is not None else [])
        completion_id = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        stream = engine.stream(GenerateRequest(request_id=completion_id, prompt=prompt_ids, params=params))

        def decode(tokens: list[int]) -> str:
            return tokenizer.decode(tokens) if tokenizer is not None else " ".join(map(str, tokens))

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for event in stream:
                chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                         "choices": [choice(decode(event.tokens), event.finish_reason)]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        tokens: list[int] = []
        finish = None
        async for event in stream:
            tokens += event.tokens
            finish = event.finish_reason or finish
        return web.json_response({
            "id": completion_id, "object": "text_completion", "created": created, "model": model_name,
            "choices": [choice(decode(tokens), finish)],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens),
                      "total_tokens": len(prompt_ids) + len(tokens)},
        })

    async def health(request: web.Request) -> web.Response:
        report = await engine.health()
        if health_extra is not None:  # the engine's weight updates: what the run's status and report show
            report = {**report, "weight_sync": health_extra()}
        return web.json_response(report)

    app.router.add_post("/generate", generate)
    app.router.add_post("/generate_group", generate_group)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


class HttpEngine(InferenceEngine):
    """The client side of an engine server: streams over ``POST /generate``."""

    def __init__(self, url: str, *, engine_id: str | None = None, connect_timeout_s: float = 5.0,
                 idle_timeout_s: float = 120.0, max_connections: int = 0) -> None:
        """``max_connections`` caps the streams open at once (0: no cap). aiohttp's default cap of 100
        would silently hold back the rest of a rollout fleet's requests and keep the engine's batch
        smaller than its ``max_batch``; the caller's own concurrency limit is the one that should bind."""
        self.url = url.rstrip("/")
        self.engine_id = engine_id or self.url
        self.max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=idle_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        # A session belongs to the event loop that created it; callers may run several loops.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(timeout=self._timeout,
                                                  connector=aiohttp.TCPConnector(limit=self.max_connections))
            self._session_loop = loop
        return self._session

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        async with closing(self._post("/generate", _encoder.encode(request), request.request_id, 1)) as pairs:
            async for _, event in pairs:
                yield event

    def stream_group(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[tuple[int, StreamEvent]]:
        """One ``POST /generate_group`` for all of ``requests``."""
        return self._post("/generate_group", _encoder.encode(list(requests)), requests[0].request_id, len(requests))

    async def _post(self, path: str, body: bytes, request_id: str, count: int) -> AsyncIterator[tuple[int, StreamEvent]]:
        """Stream the ``count`` requests of ``body`` from ``path``: ``(index, event)`` until each has its last
        event; a connection that fails or ends before that is :class:`EngineDied`."""
        unfinished = count
        grouped = path == "/generate_group"
        try:
            async with self._client().post(f"{self.url}{path}", data=body) as response:
                if response.status != 200:
                    text = await response.text()
                    if response.status >= 500:
                        raise EngineDied(f"engine {self.engine_id}: HTTP {response.status}: {text[:200]}")
                    raise ValueError(f"engine {self.engine_id} refused request {request_id}: "
                                     f"HTTP {response.status}: {text[:200]}")
                async for line in response.content:
                    if not line.strip():
                        continue
                    index, event = _group_event_decoder.decode(line) if grouped else (0, _event_decoder.decode(line))
                    if event.finish_reason is not None:
                        unfinished -= 1
                    yield index, event
                    if not unfinished:
                        return
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as exc:
            raise EngineDied(f"engine {self.engine_id} failed during request {request_id}: "
                             f"{type(exc).__name__}: {exc}") from exc
        raise EngineDied(f"engine {self.engine_id} closed the stream of {request_id} before it finished")

    async def health(self) -> dict[str, Any]:
        try:
            async with self._client().get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                data = await response.json()
                data.setdefault("alive", response.status == 200)
                return data
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as exc:
            return {"engine_id": self.engine_id, "alive": False, "error": f"{type(exc).__name__}: {exc}"}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _build_engine(args: argparse.Namespace) -> tuple[InferenceEngine, Any]:
    """The engine ``--engine`` names (``relayrl_rollout_engines``), and the model directory's tokenizer."""
    from relayrl.core.plugins import get_plugin_manager
    from relayrl.rollout.config import build_engine

    engine = build_engine(args.engine, args.model, engine_id=args.engine_id, version=args.version,
                          max_batch=args.max_batch, seed=args.seed, dtype=args.dtype or None,
                          options=json.loads(args.engine_options), pm=get_plugin_manager())
    tokenizer = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    except Exception:  # a model directory without a tokenizer serves token ids only
        tokenizer = None
    return engine, tokenizer


async def _register_with_router(args: argparse.Namespace, engine: InferenceEngine) -> Any:
    """For routers whose engines register themselves (the ``discovery`` capability, e.g. Dynamo)."""
    if not args.router:
        return None
    from relayrl.core.config import resolve_plugin_keywords
    from relayrl.core.plugins import get_plugin_manager
    from relayrl.rollout.hookspecs import ROUTERS

    record, options = resolve_plugin_keywords(get_plugin_manager(), ROUTERS, args.router, json.loads(args.router_options),
                                              path="rollout.router")
    if "discovery" not in record.capabilities:
        return None
    return await record.factory.serve_engine(engine, deployment=args.deployment, **options)


async def _serve(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    engine, tokenizer = _build_engine(args)
    controller = None
    if args.bus:
        from relayrl.core.store import open_store
        from relayrl.rollout.weights import start_controller
        from relayrl.weight_sync.config import WeightSyncSection

        # Keeps the weights current from the bus while serving (bootstrap, deltas, snapshots).
        store = open_store(args.bus, **json.loads(args.bus_options))
        try:
            section = msgspec.json.decode(args.weight_sync, type=WeightSyncSection)
        except msgspec.DecodeError as exc:  # not JSON, or a key or value the section does not take
            raise SystemExit(f"--weight-sync: {exc}") from None
        overrides = {key: value for key, value in (("prefix", args.weights_prefix),
                                                   ("poll_interval_s", args.poll_interval)) if value is not None}
        controller, stop_controller, _ = start_controller(engine, store, section, **overrides)
        if args.wait_for_weights:
            # Serve nothing from the directory's weights: READY only once a published version is applied.
            deadline = time.monotonic() + args.wait_for_weights
            while engine.served_version <= args.version:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no weight version applied from {args.bus} within {args.wait_for_weights} s")
                await asyncio.sleep(0.05)
    extra = None
    if controller is not None:
        from relayrl.rollout.weights import apply_timings

        extra = lambda: apply_timings(controller)  # noqa: E731 - bound to this server's controller
    runner = web.AppRunner(build_app(engine, tokenizer=tokenizer, model_name=args.model, health_extra=extra))
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
    registration = await _register_with_router(args, engine)
    print(f"READY {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    if registration is not None:  # deregister first, so that routers stop sending requests here
        registration.stop()
    if controller is not None:
        stop_controller.set()
    await runner.cleanup()
    await engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a relayrl inference engine over HTTP.")
    parser.add_argument("--model", required=True, help="local model directory (config + safetensors)")
    parser.add_argument("--engine", default="torch", help="engine backend (relayrl_rollout_engines): torch, vllm, ...")
    parser.add_argument("--engine-options", default="{}", metavar="JSON", help="more keyword arguments of the engine")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="dtype to serve (relayrl run: what the trainer publishes, rollout.engine_dtype or model.dtype)")
    parser.add_argument("--router", default="", help="also register with this router, if its engines register "
                                                     "themselves (e.g. dynamo)")
    parser.add_argument("--router-options", default="{}", metavar="JSON", help="options of --router")
    parser.add_argument("--deployment", default=None, help="deployment id for --router (relayrl run: the run directory)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--engine-id", default=None)
    parser.add_argument("--version", type=int, default=0, help="policy version of the weights in --model")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--bus", default=None, help="store URL to follow for weight updates (relayrl-weight-sync)")
    parser.add_argument("--bus-options", default="{}", metavar="JSON",
                        help="store backend options for --bus, e.g. '{\"endpoint_url\": \"http://...\"}'")
    parser.add_argument("--weight-sync", default="{}", metavar="JSON",
                        help="with --bus: the [weight_sync] section its controller is built from (relayrl run: "
                             "the run's), e.g. '{\"apply_mode\": \"xor\", \"stage_url\": \"file:///dev/shm/run\"}'")
    parser.add_argument("--weights-prefix", default=None, help="overrides --weight-sync's prefix")
    parser.add_argument("--poll-interval", type=float, default=None,
                        help="seconds between manifest polls (overrides --weight-sync's poll_interval_s)")
    parser.add_argument("--wait-for-weights", type=float, default=0.0, metavar="SECONDS",
                        help="with --bus: apply a published version (newer than --version) before serving")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
