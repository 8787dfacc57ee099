"""``DynamoRouter``: relayrl's router protocol over Dynamo's request plane.

Engines register as instances of one Dynamo endpoint (``namespace.engine.generate``); the router
discovers them through Dynamo's discovery (file, mem or etcd), picks one per request and sends the
request to it with Dynamo's ``direct`` call over the TCP request plane. Picking is relayrl's, so
that failed instances can be skipped and failures retried elsewhere:

``round-robin``  the next live instance;
``random``       a uniformly random live instance;
``sticky``       every turn of one trajectory (the first two ``/`` parts of the request id, as the
                 agent harness names them) to the same instance while it is live, so multi-turn
                 contexts hit that engine's prefix cache.

Failures follow the router contract (``relayrl.rollout.testing.RouterTests``): an instance that fails
before the first event is marked down for ``down_for_s`` and the request goes to another one; a
failure after events have streamed raises :class:`EngineDied`, and the token-recording proxy resumes
the generation through the router on another instance. A dead process stays listed by ``file``
discovery until it is found unreachable, which is exactly the marking above.

The router owns an event loop in a daemon thread (Dynamo's runtime is bound to the loop it was
created on; callers may come from many loops). Given engines (``serve=True``), it also serves each
of them as an instance of its own in that loop: a whole deployment in one process, which is how the
conformance suite runs it. In a deployment, engine processes register themselves
(:func:`relayrl_dynamo.worker.EngineWorker`) and the router is built with ``serve=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from relayrl.rollout.loop_thread import Emit, LoopThread
from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine, StreamEvent
from relayrl_dynamo.runtime import DynamoSettings, create_runtime
from relayrl_dynamo.worker import ERROR_KEY, EngineWorker

__all__ = ["POLICIES", "DynamoRouter"]

POLICIES = ("round-robin", "random", "sticky")


class _RemoteError(Exception):
    """An error the engine reported for a request (not a transport failure): never retried."""


class _RemoteValueError(_RemoteError, ValueError):
    """The engine refused the request as invalid."""


def _remote_error(payload: dict[str, Any]) -> Exception:
    kind, message = payload.get("type", "RuntimeError"), payload.get("message", "")
    if kind == "EngineDied":
        return EngineDied(message)
    if kind == "ValueError":
        return _RemoteValueError(message)
    return _RemoteError(f"{kind}: {message}")


class DynamoRouter(InferenceEngine):
    """Routes requests to the Dynamo instances of ``settings.path`` (see the module docstring)."""

    def __init__(self, engines: Sequence[InferenceEngine] = (), *, settings: DynamoSettings | None = None,
                 policy: str = "round-robin", retries: int = 2, down_for_s: float = 2.0, serve: bool = True,
                 expect_instances: int | None = None, start_timeout_s: float = 60.0, seed: int | None = None,
                 engine_id: str = "dynamo-router") -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r} ({', '.join(POLICIES)})")
        self.settings = (settings or DynamoSettings.isolated()).resolved()
        self.policy = policy
        self.retries = retries
        self.down_for_s = down_for_s
        self.engine_id = engine_id
        self.engines = list(engines)
        self.in_flight: dict[int, int] = {}
        self._down_until: dict[int, float] = {}
        self._cycle = itertools.count()
        self._random = random.Random(seed)
        self._workers: list[EngineWorker] = []
        self._loop_thread = LoopThread(f"{engine_id}-loop")
        expected = expect_instances if expect_instances is not None else (len(self.engines) if serve else 1)
        try:
            self._call(self._start(self.engines if serve else [], expected, start_timeout_s), start_timeout_s + 5)
        except BaseException:
            self.close_sync()
            raise

    # ------------------------------------------------------------------ set-up
    def _call(self, coroutine: Any, timeout_s: float | None = 60.0) -> Any:
        return self._loop_thread.call(coroutine, timeout_s)

    async def _start(self, engines: Sequence[InferenceEngine], expected: int, timeout_s: float) -> None:
        for engine in engines:
            worker = EngineWorker(engine, self.settings)
            await worker.start()
            self._workers.append(worker)
        self._runtime = create_runtime(asyncio.get_running_loop(), self.settings)
        self._client = await self._runtime.endpoint(self.settings.path).client()
        deadline = time.monotonic() + timeout_s
        while len(self._client.instance_ids()) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self._client.instance_ids())} of {expected} Dynamo instances of "
                                   f"{self.settings.path} registered within {timeout_s} s "
                                   f"(discovery {self.settings.discovery})")
            await asyncio.sleep(0.05)

    def instance_ids(self) -> list[int]:
        """The instances discovery lists now (live or not)."""
        return sorted(self._client.instance_ids())

    # ------------------------------------------------------------------ routing
    def pick(self, request: GenerateRequest, exclude: set[int] = frozenset()) -> int | None:
        """The instance the policy chooses for ``request``, avoiding ``exclude`` and instances marked down."""
        listed = self.instance_ids()
        if not listed:
            return None
        now = time.monotonic()
        fresh = [instance for instance in listed if instance not in exclude] or listed
        up = [instance for instance in fresh if self._down_until.get(instance, 0.0) <= now] or fresh
        if self.policy == "random":
            return self._random.choice(up)
        if self.policy == "sticky":
            trajectory = "/".join(request.request_id.split("/")[:2])
            return up[zlib.crc32(trajectory.encode()) % len(up)]
        return up[next(self._cycle) % len(up)]

    def mark_down(self, instance: int) -> None:
        self._down_until[instance] = time.monotonic() + self.down_for_s

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        async with contextlib.aclosing(self._loop_thread.stream(lambda emit: self._route(request, emit))) as events:
            async for event in events:
                yield event

    async def _route(self, request: GenerateRequest, emit: Emit) -> None:
        payload = msgspec.to_builtins(request)
        tried: set[int] = set()
        for attempt in range(self.retries + 1):
            instance = self.pick(request, exclude=tried)
            if instance is None:
                emit(EngineDied(f"no Dynamo instance of {self.settings.path} is registered"))
                return
            tried.add(instance)
            started = False
            self.in_flight[instance] = self.in_flight.get(instance, 0) + 1
            try:
                async for event in self._send(payload, instance):
                    started = True
                    emit(event)
                    if event.finish_reason is not None:
                        return
                raise EngineDied(f"instance {instance:x} ended the stream of {request.request_id} before it finished")
            except _RemoteError as exc:  # the request's fault: the same everywhere
                # (Dynamo's own transport errors, ValueError included, fall through to the next clause.)
                emit(exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # EngineDied, or Dynamo's transport errors (connection refused, reset)
                self.mark_down(instance)
                if started or attempt == self.retries:
                    error = exc if isinstance(exc, EngineDied) else EngineDied(
                        f"Dynamo instance {instance:x} failed during {request.request_id}: {type(exc).__name__}: {exc}")
                    emit(error)
                    return
            finally:
                self.in_flight[instance] -= 1

    async def _send(self, payload: dict[str, Any], instance: int) -> AsyncIterator[StreamEvent]:
        stream = await self._client.direct(payload, instance)
        async for item in stream:
            data = item.data()
            if ERROR_KEY in data:
                raise _remote_error(data[ERROR_KEY])
            yield msgspec.convert(data, StreamEvent)

    # ------------------------------------------------------------------ lifecycle
    async def health(self) -> dict[str, Any]:
        listed = self.instance_ids() if self._loop_thread.alive else []
        now = time.monotonic()
        down = [instance for instance in listed if self._down_until.get(instance, 0.0) > now]
        return {"engine_id": self.engine_id, "alive": len(listed) > len(down), "instances": len(listed),
                "down": len(down), "in_flight": sum(self.in_flight.values()), "namespace": self.settings.namespace}

    async def close(self) -> None:
        """Stop routing (:meth:`close_sync`), then close the given engines on the caller's loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)
        for engine in self.engines:
            await engine.close()

    def close_sync(self) -> None:
        """Deregister the engines this router serves, shut its runtime down, stop its loop."""
        if not self._loop_thread.alive:
            return

        async def shutdown() -> None:
            for worker in self._workers:
                worker.stop()
            runtime = getattr(self, "_runtime", None)
            if runtime is not None:
                with contextlib.suppress(Exception):
                    runtime.shutdown()

        with contextlib.suppress(Exception):
            self._call(shutdown(), timeout_s=30)
        self._loop_thread.stop()
