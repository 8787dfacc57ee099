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

import pytest
import torch

from relayrl.algo.sampling import KeptSets, replay_logprobs
from relayrl.core.wire import GeneratedSpan
from relayrl.rollout.protocol import GenerateRequest, InferenceEngine, SamplingParams
from relayrl.weight_sync import EngineAdapter
from relayrl.weight_sync.bits import bits_view

PROMPTS = [[1, 5, 9, 12], [1, 7], [1, 3, 3, 3, 8, 20, 4], [1, 30, 31]]


def request(index: int, *, max_tokens: int = 12, seed: int | None = None, **params) -> GenerateRequest:
    return GenerateRequest(request_id=f"r{index}-{seed}", prompt=PROMPTS[index % len(PROMPTS)],
                           params=SamplingParams(max_tokens=max_tokens, seed=seed, **params))


def run(coroutine):
    return asyncio.run(coroutine)


def replayed(model: torch.nn.Module, prompt: list[int], span: GeneratedSpan, temperature: float = 1.0) -> torch.Tensor:
    """The trainer's replayed logprobs of ``span`` after ``prompt`` under ``model``."""
    tokens = list(span.token_ids())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    offsets, ids = span.kept_csr()
    if span.has_kept_sets:
        kept = KeptSets(torch.tensor(list(offsets), dtype=torch.int64), torch.tensor(list(ids), dtype=torch.int64))
    else:
        kept = KeptSets(torch.zeros(len(tokens) + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    return replay_logprobs(logits, torch.tensor(tokens), kept, temperature=temperature)


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
