"""``LoopThread``: an asyncio event loop of its own, in a daemon thread, for loop-bound libraries.

vLLM's ``AsyncLLM`` and Dynamo's ``DistributedRuntime`` belong to the event loop they start on,
while relayrl's engines and routers are called from many loops (each test's ``asyncio.run``, the
engine server's loop, a weight controller's thread). Engines built on such libraries own a
``LoopThread``: synchronous callers run coroutines on it with :meth:`LoopThread.call`, and
:meth:`LoopThread.stream` relays the events a coroutine produces there to the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from relayrl.rollout.protocol import StreamEvent

__all__ = ["Emit", "LoopThread"]

Emit = Callable[[StreamEvent | BaseException], None]
"""How a producer hands an event (or the exception that ends the stream) to its consumer."""


class LoopThread:
    """An event loop running in a daemon thread named ``name`` (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float | None = 60.0) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (never call from the loop itself)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    async def stream(self, produce: Callable[[Emit], Coroutine[Any, Any, None]]) -> AsyncIterator[StreamEvent]:
        """Run ``produce(emit)`` on the loop and yield what it emits, on the caller's loop.

        The stream ends after an event with a ``finish_reason``; an emitted exception is raised
        here. A consumer that stops early cancels the producer (which should abort its request).
        """
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()

        def emit(item: StreamEvent | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody listens
                caller.call_soon_threadsafe(queue.put_nowait, item)

        future = asyncio.run_coroutine_threadsafe(produce(emit), self.loop)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not future.done():
                future.cancel()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop and join its thread."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout_s)
