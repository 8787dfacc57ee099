"""``EngineTests``: the conformance suite every inference engine passes, built in or plugin.

Subclass it and override two fixtures::

    class TestMyEngine(EngineTests):
        @pytest.fixture
        def engine(self, reference_model):        # serves exactly reference_model's weights
            return MyEngine(...)

        @pytest.fixture
        def reference_model(self):               # a transformers causal LM (the trainer's view)
            return tiny_llama(seed=0)

The weight-update tests need an engine whose ``weight_adapter()`` is not None; others skip them,
saying so. They update the engine through that adapter in the order a weight controller does
(pause, write the bits, record the version, reset caches, resume). Every check compares the engine with the trainer's side of the contract: a token's
recorded logprob must equal :func:`relayrl.algo.replay_logprobs` on the reference model with the
same weights and the recorded kept-set.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy
import pytest
import torch

from relayrl.algo.routing import RoutingCapture, moe_routers, recorded_routing
from relayrl.algo.sampling import KeptSets, replay_logprobs
from relayrl.core.wire import GeneratedSpan
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, SamplingParams, collect_span
from relayrl.weight_sync import EngineAdapter
from relayrl.weight_sync.bits import bits_view

PROMPTS = [[1, 5, 9, 12], [1, 7], [1, 3, 3, 3, 8, 20, 4], [1, 30, 31]]


def request(index: int, *, max_tokens: int = 12, seed: int | None = None, **params) -> GenerateRequest:
    """A request for ``PROMPTS[index]``; it asks for the routing record (mixture-of-experts engines)."""
    params.setdefault("routing_from", 0)
    return GenerateRequest(request_id=f"r{index}-{seed}", prompt=PROMPTS[index % len(PROMPTS)],
                           params=SamplingParams(max_tokens=max_tokens, seed=seed, **params))


def run(coroutine):
    return asyncio.run(coroutine)


def replayed(model: torch.nn.Module, prompt: list[int], span: GeneratedSpan, temperature: float = 1.0) -> torch.Tensor:
    """The trainer's replayed logprobs of ``span`` after ``prompt`` under ``model``; a mixture of
    experts routes the positions the span's routing record covers as the engine did (routing replay)."""
    tokens = list(span.token_ids())
    input_ids = torch.tensor([prompt + tokens])
    with torch.no_grad(), replayed_routing(model, span, input_ids.shape[1]):
        logits = model(input_ids=input_ids).logits[0, len(prompt) - 1:-1].float()
    offsets, ids = span.kept_csr()
    if span.has_kept_sets:
        kept = KeptSets(torch.tensor(list(offsets), dtype=torch.int64), torch.tensor(list(ids), dtype=torch.int64))
    else:
        kept = KeptSets(torch.zeros(len(tokens) + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    return replay_logprobs(logits, torch.tensor(tokens), kept, temperature=temperature)


def routing_tensors(span: GeneratedSpan, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, length, layers, top_k]`` expert ids and ``[1, length]`` mask from the span's routing record."""
    record = span.routing
    assert record is not None
    dtype = numpy.dtype("u1") if record.width == 1 else numpy.dtype("<u2")
    experts = numpy.frombuffer(record.experts, dtype=dtype).reshape(len(record), record.layers, record.top_k)
    routing = torch.zeros((1, length, record.layers, record.top_k), dtype=torch.int64)
    mask = torch.zeros((1, length), dtype=torch.bool)
    routing[0, record.start:record.end] = torch.from_numpy(experts.astype(numpy.int64))
    mask[0, record.start:record.end] = True
    return routing, mask


def replayed_routing(model: torch.nn.Module, span: GeneratedSpan, length: int) -> contextlib.AbstractContextManager:
    routers = moe_routers(model)
    if not routers or span.routing is None:
        return contextlib.nullcontext()
    return recorded_routing(routers, *routing_tensors(span, length))


def recorded(span: GeneratedSpan) -> torch.Tensor:
    return torch.tensor(list(span.token_logprobs()))


def perturbed_state(model: torch.nn.Module, scale: float = 0.05, seed: int = 123) -> dict[str, torch.Tensor]:
    """Every floating tensor of ``model`` plus noise; tied tensors (one storage, several names) stay tied."""
    generator = torch.Generator().manual_seed(seed)
    by_storage: dict[int, torch.Tensor] = {}
    state = {}
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            key = value.data_ptr()
            if key not in by_storage:
                by_storage[key] = value + scale * torch.randn(value.shape, generator=generator)
            state[name] = by_storage[key]
    return state


def weight_adapter(engine: InferenceEngine) -> EngineAdapter:
    """The engine's weight-sync adapter; skips the test, saying why, when it takes no weight updates."""
    adapter = engine.weight_adapter()
    if adapter is None:
        pytest.skip(f"{type(engine).__name__} takes no weight updates (weight_adapter() is None)")
    assert isinstance(adapter, EngineAdapter), f"{type(adapter).__name__} lacks part of weight-sync's EngineAdapter"
    return adapter


def write_weights(adapter: EngineAdapter, state: dict[str, torch.Tensor], version: int) -> None:
    """Write ``state`` into a paused engine as a controller's snapshot apply does: the bits of each
    tensor in the engine's own dtype, then the version (caches are reset after it, as configured by
    default). The caller pauses and resumes."""
    specs = adapter.tensor_specs()
    bits = {}
    for name, value in state.items():
        dtype = getattr(torch, specs[name][0])
        bits[name] = bits_view(value.detach().to(dtype).contiguous(), name=name).copy()
    adapter.apply_tensors(bits)
    adapter.set_served_version(version)
    adapter.reset_caches()


class EngineTests:
    """Conformance suite for :class:`relayrl.rollout.protocol.InferenceEngine` implementations."""

    #: Tolerance between recorded and replayed logprobs (float32 engine, float32 trainer).
    logprob_atol = 2e-4

    @pytest.fixture
    def engine(self, reference_model) -> InferenceEngine:
        raise NotImplementedError("override `engine`: an engine serving reference_model's weights")

    @pytest.fixture
    def reference_model(self):
        raise NotImplementedError("override `reference_model`: a transformers causal LM")

    def test_same_seed_same_tokens(self, engine) -> None:
        first = run(engine.generate(request(0, seed=7, top_p=0.9)))
        second = run(engine.generate(request(0, seed=7, top_p=0.9)))
        assert list(first.token_ids()) == list(second.token_ids())
        assert first.token_logprobs() == second.token_logprobs() and first.kept_ids == second.kept_ids

    def test_batching_does_not_change_a_seeded_request(self, engine) -> None:
        alone = run(engine.generate(request(2, seed=11, top_p=0.8)))

        async def crowded():
            spans = await asyncio.gather(*(engine.generate(request(index, seed=100 + index)) for index in range(4)),
                                         engine.generate(request(2, seed=11, top_p=0.8)))
            return spans[-1]

        assert list(run(crowded()).token_ids()) == list(alone.token_ids())

    def test_a_request_arriving_mid_generation_is_served_without_waiting_for_the_batch(self, engine) -> None:
        """Continuous batching: a short request sent while a long one streams finishes first (it joins the
        running batch instead of waiting for it to drain), with the tokens it gets alone."""
        alone = run(engine.generate(request(1, seed=21, max_tokens=8)))

        async def arriving_late():
            finished: list[str] = []
            started = asyncio.Event()

            async def long() -> None:
                async for event in engine.stream(request(0, seed=2, max_tokens=400)):
                    started.set()
                    if event.finish_reason is not None:
                        finished.append("long")

            async def short():
                await started.wait()  # the long request is generating
                span = await engine.generate(request(1, seed=21, max_tokens=8))
                finished.append("short")
                return span

            _, span = await asyncio.gather(long(), short())
            return finished, span

        finished, late = run(arriving_late())
        assert finished == ["short", "long"], "the late request waited for the running request to finish"
        assert list(late.token_ids()) == list(alone.token_ids())

    def test_a_group_call_streams_each_request_as_it_would_alone(self, engine, reference_model) -> None:
        """``stream_group``: a group's samples (one prompt, their own seeds) and another prompt in one call;
        each index gets exactly its request's stream: the tokens it gets alone, one last event, and the
        logprobs the trainer's replay expects."""
        requests = [request(2, seed=30 + index, max_tokens=10, top_p=0.9) for index in range(3)]
        requests.append(request(1, seed=40, max_tokens=6))
        alone = [run(engine.generate(one)) for one in requests]

        async def grouped():
            events: dict[int, list] = {index: [] for index in range(len(requests))}
            async for index, event in engine.stream_group(requests):
                events[index].append(event)
            return events

        events = run(grouped())
        for index, one in enumerate(requests):
            assert [event.finish_reason is not None for event in events[index]].count(True) == 1
            assert events[index][-1].finish_reason is not None, f"request {index}: events after its last"
            span = collect_span(events[index])
            assert list(span.token_ids()) == list(alone[index].token_ids()), f"request {index} differs in the group"
            torch.testing.assert_close(recorded(span), replayed(reference_model, one.prompt, span, 1.0),
                                       atol=self.logprob_atol, rtol=0)

    def test_a_next_turn_samples_as_from_its_whole_context(self, engine, reference_model) -> None:
        """Multi-turn: the next turn's prompt extends the last one (context, answer, tool result). An engine
        may reuse the cache of the turn before (prefix reuse); the turn's tokens are the same with or
        without it, and its logprobs are those of the whole context under the served weights."""
        first = run(engine.generate(request(2, seed=5, max_tokens=10)))
        context = PROMPTS[2] + list(first.token_ids()) + [40, 41, 42]  # + a tool result

        def next_turn() -> GenerateRequest:
            return GenerateRequest(request_id="turn-2", prompt=context,
                                   params=SamplingParams(max_tokens=10, seed=6, routing_from=0))

        continued = run(engine.generate(next_turn()))  # right after its first turn (a prefix may be reused)
        again = run(engine.generate(next_turn()))  # the same prompt again (nothing of it to reuse)
        assert list(continued.token_ids()) == list(again.token_ids())
        torch.testing.assert_close(recorded(continued), replayed(reference_model, context, continued),
                                   atol=self.logprob_atol, rtol=0)

    def test_a_next_turn_after_a_weight_update_reuses_nothing_computed_before_it(self, engine, reference_model) -> None:
        adapter = weight_adapter(engine)
        first = run(engine.generate(request(0, seed=8, max_tokens=10)))
        new_state = perturbed_state(reference_model, seed=17)
        adapter.pause()
        try:
            write_weights(adapter, new_state, adapter.served_version + 1)  # resets caches, as configured by default
        finally:
            adapter.resume()
        context = PROMPTS[0] + list(first.token_ids()) + [40, 41]
        span = run(engine.generate(GenerateRequest(request_id="after-update", prompt=context,
                                                   params=SamplingParams(max_tokens=10, seed=9, routing_from=0))))
        reference_model.load_state_dict(new_state, strict=False)
        torch.testing.assert_close(recorded(span), replayed(reference_model, context, span), atol=self.logprob_atol, rtol=0)

    @pytest.mark.parametrize("params", [{"top_p": 1.0}, {"top_p": 0.8}, {"top_k": 5, "temperature": 0.7},
                                        {"top_p": 0.95, "max_kept": 3}])
    def test_logprobs_match_trainer_replay(self, engine, reference_model, params) -> None:
        for index in range(3):
            span = run(engine.generate(request(index, seed=index, max_tokens=16, **params)))
            assert len(span) == 16 and span.finish_reason == "length"
            expected = replayed(reference_model, PROMPTS[index], span, params.get("temperature", 1.0))
            torch.testing.assert_close(recorded(span), expected, atol=self.logprob_atol, rtol=0)
            span.check()  # every sampled token is inside its own kept-set

    def test_stop_tokens_end_the_stream(self, engine) -> None:
        span = run(engine.generate(request(1, seed=3, max_tokens=64, top_k=1)))  # greedy-like: deterministic path
        stop = int(span.token_ids()[4])
        stopped = run(engine.generate(request(1, seed=3, max_tokens=64, top_k=1, stop_token_ids=[stop])))
        assert stopped.finish_reason == "stop"
        assert int(stopped.token_ids()[-1]) == stop and len(stopped) <= 5

    def test_tokens_carry_the_served_version(self, engine) -> None:
        adapter = weight_adapter(engine)
        span = run(engine.generate(request(0, seed=1)))
        assert set(span.token_versions()) == {adapter.served_version}

    def test_apply_in_place_changes_outputs_and_invalidates_caches(self, engine, reference_model) -> None:
        adapter = weight_adapter(engine)
        before = run(engine.generate(request(3, seed=5, top_p=0.9)))  # also warms any prefix cache
        new_state = perturbed_state(reference_model)
        version = adapter.served_version + 1
        adapter.pause()
        try:
            write_weights(adapter, new_state, version)
        finally:
            adapter.resume()
        after = run(engine.generate(request(3, seed=5, top_p=0.9)))
        assert adapter.served_version == version and set(after.token_versions()) == {version}
        assert after.logprobs != before.logprobs
        reference_model.load_state_dict(new_state, strict=False)
        # Same prompt as before: a stale prefix cache would show up as a replay mismatch here.
        torch.testing.assert_close(recorded(after), replayed(reference_model, PROMPTS[3], after),
                                   atol=self.logprob_atol, rtol=0)

    def test_update_during_generation_keeps_streaming_with_new_versions(self, engine, reference_model) -> None:
        adapter = weight_adapter(engine)
        old_version = adapter.served_version
        new_state = perturbed_state(reference_model, seed=9)

        # Long enough that an engine running ahead of its consumer (vLLM) is still generating when
        # the update lands, a few events in.
        max_tokens = 400

        async def generate_with_update():
            events = []
            async for event in engine.stream(request(0, seed=2, max_tokens=max_tokens)):
                events.append(event)
                if len(events) == 3:
                    await asyncio.get_running_loop().run_in_executor(None, adapter.pause)
                    write_weights(adapter, new_state, old_version + 1)
                    adapter.resume()
            return events

        events = run(generate_with_update())
        versions = [version for event in events for version in event.versions]
        assert len(versions) == max_tokens and versions[0] == old_version and versions[-1] == old_version + 1
        assert versions == sorted(versions)  # one switch, never back


class MoEEngineTests(EngineTests):
    """The conformance suite on a mixture-of-experts model, plus routing capture (routing replay).

    Every :class:`EngineTests` check runs with ``reference_model`` a mixture of experts (e.g.
    :func:`~relayrl.rollout.testing.tiny_moe`); the trainer's replay then forces the routing the
    engine recorded, so the logprob checks hold even where engine and trainer numerics would route a
    near-tie differently. An engine that cannot record routing sets ``records_routing = False``: the
    routing checks then skip, saying so, and replay falls back to the trainer's own routing.
    """

    records_routing = True
    #: Share of (position, layer) pairs whose expert set may differ between the engine's record and the
    #: reference model's own routing (near-ties under different kernels and batch layouts).
    routing_disagreement = 0.02

    def _require_routing(self) -> None:
        if not self.records_routing:
            pytest.skip(f"{type(self).__name__}: this engine records no expert routing")

    def test_routing_covers_every_position_from_routing_from(self, engine, reference_model) -> None:
        self._require_routing()
        routers = moe_routers(reference_model)
        for index, start in ((0, 0), (2, 3)):
            span = run(engine.generate(request(index, seed=index, max_tokens=9, routing_from=start)))
            record = span.routing
            prompt = PROMPTS[index]
            assert record is not None, "asked for routing, got none"
            assert (record.start, record.first_generated) == (start, len(prompt))
            assert record.end == len(prompt) + len(span) - 1  # the last token is never fed back
            assert (record.layers, record.top_k) == (len(routers), routers[0].top_k)

    def test_no_routing_unless_asked(self, engine) -> None:
        self._require_routing()
        assert run(engine.generate(request(1, seed=1, routing_from=None))).routing is None

    def test_recorded_routing_is_the_reference_models_own(self, engine, reference_model) -> None:
        self._require_routing()
        routers = moe_routers(reference_model)
        compared = differs = 0
        spans = run(_gather(engine, [request(index, seed=index, max_tokens=16) for index in range(4)]))
        for index, span in enumerate(spans):
            input_ids = torch.tensor([PROMPTS[index] + list(span.token_ids())])
            with torch.no_grad(), RoutingCapture(routers) as capture:
                reference_model(input_ids=input_ids)
            own = capture.take().reshape(input_ids.shape[1], len(routers), -1)
            engine_routing, _ = routing_tensors(span, input_ids.shape[1])
            record = span.routing
            theirs = engine_routing[0, record.start:record.end]
            mine = own[record.start:record.end]
            compared += theirs.shape[0] * theirs.shape[1]
            differs += int((theirs.sort(-1).values != mine.sort(-1).values).any(-1).sum())
        assert differs <= self.routing_disagreement * compared, f"{differs} of {compared} routed differently"


async def _gather(engine: InferenceEngine, requests: list[GenerateRequest]) -> list[GeneratedSpan]:
    return list(await asyncio.gather(*(engine.generate(item) for item in requests)))
