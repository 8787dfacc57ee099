"""The engine side: an :class:`InferenceEngine` served as one Dynamo instance.

The wire format is relayrl's own, as plain JSON-like objects: a request is a
:class:`GenerateRequest`, each response item a :class:`StreamEvent`. An engine failure is sent as
a final item ``{"relayrl_error": {"type", "message"}}`` so that the router can tell an engine that
died (``EngineDied``: retry elsewhere, or let the token-recording proxy resume) from a request that
was wrong (``ValueError``: the caller's problem, never retried).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine
from relayrl_dynamo.runtime import DynamoSettings, create_runtime

__all__ = ["ERROR_KEY", "EngineWorker", "engine_handler"]

ERROR_KEY = "relayrl_error"


def engine_handler(engine: InferenceEngine) -> Any:
    """A Dynamo request handler streaming ``engine``'s events for each request."""

    async def generate(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        try:
            decoded = msgspec.convert(request, GenerateRequest)
        except msgspec.ValidationError as exc:
            yield {ERROR_KEY: {"type": "ValueError", "message": f"invalid generate request: {exc}"}}
            return
        try:
            async for event in engine.stream(decoded):
                yield msgspec.to_builtins(event)
                if context is not None and context.is_stopped():
                    return  # the client went away: closing the stream frees the engine's batch row
        except EngineDied as exc:
            yield {ERROR_KEY: {"type": "EngineDied", "message": str(exc)}}
        except Exception as exc:  # reported to the caller; this worker keeps serving
            yield {ERROR_KEY: {"type": type(exc).__name__, "message": str(exc)}}

    return generate


class EngineWorker:
    """``engine`` registered under ``settings.path`` with its own runtime (one Dynamo instance).

    Use on a running event loop: ``await worker.start()`` registers and serves; ``worker.stop()``
    deregisters (with ``file`` discovery a process that dies without it stays listed until the
    router finds it unreachable and marks it down).
    """

    def __init__(self, engine: InferenceEngine, settings: DynamoSettings) -> None:
        self.engine = engine
        self.settings = settings.resolved()
        self.runtime: Any = None
        self.instance_id: int | None = None
        self._serving: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        self.runtime = create_runtime(asyncio.get_running_loop(), self.settings)
        endpoint = self.runtime.endpoint(self.settings.path)
        self.instance_id = endpoint.connection_id()
        self._serving = asyncio.ensure_future(endpoint.serve_endpoint(engine_handler(self.engine),
                                                                      graceful_shutdown=False))
        await asyncio.sleep(0)  # let the registration start before anyone waits for it

    def stop(self) -> None:
        if self.runtime is not None:
            with contextlib.suppress(Exception):
                self.runtime.shutdown()
            self.runtime = None
        if self._serving is not None and not self._serving.done():
            self._serving.cancel()
