"""Routers against the router suite, and the token-recording proxy against a killed engine process."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import EngineDied, GenerateRequest, InferenceEngine, SamplingParams
from relayrl.rollout.routing import Router, TokenRecordingProxy
from relayrl.rollout.testing import RouterTests, tiny_llama
from relayrl.rollout.testing.engine_tests import recorded, replayed
from relayrl.rollout.testing.router_tests import FailingEngine


class TestRoundRobinRouter(RouterTests):
    @pytest.fixture
    def make_router(self):
        return lambda engines: Router(engines, policy="round-robin", down_for_s=60)


class TestLeastLoadedRouter(RouterTests):
    @pytest.fixture
    def make_router(self):
        return lambda engines: Router(engines, policy="least-loaded", down_for_s=60)


def test_least_loaded_prefers_the_idle_engine():
    model = tiny_llama(seed=0)
    engines = [TorchEngine(model, engine_id=f"e{index}") for index in range(2)]
    router = Router(engines, policy="least-loaded")
    router.in_flight["e0"] = 5
    assert router.pick().engine_id == "e1"
    router.in_flight["e0"] = 0
    router.in_flight["e1"] = 1
    assert router.pick().engine_id == "e0"
    asyncio.run(router.close())


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        Router([TorchEngine(tiny_llama())], policy="random")


def test_proxy_resumes_in_process_after_a_scripted_death():
    model = tiny_llama(seed=0)
    dying = FailingEngine(TorchEngine(model, engine_id="a"), fail_after_tokens=7)
    router = Router([dying, TorchEngine(model, engine_id="b")], policy="round-robin", down_for_s=60)
    prompt = [1, 9, 4]
    result = asyncio.run(TokenRecordingProxy(router).generate(
        GenerateRequest(request_id="t", prompt=prompt, params=SamplingParams(max_tokens=25, seed=4, top_p=0.9))))
    assert len(result.span) == 25 and result.resumes == 1 and result.engine_ids == ["a", "b"]
    torch.testing.assert_close(recorded(result.span), replayed(model, prompt, result.span), atol=2e-4, rtol=0)
    asyncio.run(router.close())


def test_proxy_gives_up_after_max_resumes():
    model = tiny_llama(seed=0)
    engines = [FailingEngine(TorchEngine(model, engine_id=name), fail_after_tokens=2) for name in ("a", "b")]
    router = Router(engines, down_for_s=0)
    with pytest.raises(EngineDied):
        asyncio.run(TokenRecordingProxy(router, max_resumes=1).generate(
            GenerateRequest(request_id="t", prompt=[1, 2], params=SamplingParams(max_tokens=50))))
    asyncio.run(router.close())


def test_killing_an_engine_process_mid_generation_loses_no_token(engine_server_factory, tiny_model_dir):
    """Two engine server processes; the one serving the request is SIGKILLed after 15 tokens."""
    from transformers import AutoModelForCausalLM

    # Every token streamed as it is sampled (the served default holds them up to 0.25 s, longer than
    # this whole generation takes), so that the kill lands mid-generation.
    every_token = ("--engine-options", '{"stream_interval_s": 0}')
    servers = {server.engine_id: server for server in (engine_server_factory("engine-a", *every_token),
                                                       engine_server_factory("engine-b", *every_token))}
    router = Router([HttpEngine(server.url, engine_id=name) for name, server in servers.items()], down_for_s=60)
    killed: list[str] = []
    seen = [0]

    def on_event(event):
        seen[0] += len(event.tokens)
        if seen[0] >= 15 and not killed:
            killed.append(event.engine_id)
            servers[event.engine_id].kill()

    prompt = [1, 17, 23, 5]
    request = GenerateRequest(request_id="long", prompt=prompt, params=SamplingParams(max_tokens=120, top_p=0.9, seed=8))
    result = asyncio.run(TokenRecordingProxy(router).generate(request, on_event=on_event))
    assert killed and servers[killed[0]].process.poll() is not None
    assert len(result.span) == 120 and result.span.finish_reason == "length"
    assert result.resumes == 1 and result.engine_ids[0] == killed[0] and len(result.engine_ids) == 2
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()
    torch.testing.assert_close(recorded(result.span), replayed(reference, prompt, result.span), atol=2e-4, rtol=0)
    result.span.check()
    asyncio.run(router.close())


def test_killing_an_engine_mid_batch_with_a_live_prefix_loses_nothing_the_proxy_cannot_resume(engine_server_factory,
                                                                                             tiny_model_dir):
    """A trajectory's first turn leaves its prefix kept on engine A; its next turn reuses it there, batched
    with other requests, and A is SIGKILLed mid-generation: every request resumes on engine B (which has
    no prefix: a whole prefill) and every token is the one the reference model's replay expects."""

    every_token = ("--engine-options", '{"stream_interval_s": 0}')
    servers = {name: engine_server_factory(name, *every_token) for name in ("engine-a", "engine-b")}
    engines = [HttpEngine(server.url, engine_id=name) for name, server in servers.items()]
    router = Router(engines, policy="least-loaded", down_for_s=60)  # idle engines: the first (A) is picked
    prompt = [1, 17, 23, 5]

    def turn(request_id: str, context: list[int], seed: int) -> GenerateRequest:
        return GenerateRequest(request_id=request_id, prompt=context,
                               params=SamplingParams(max_tokens=120, top_p=0.9, seed=seed))

    async def scenario():
        proxy = TokenRecordingProxy(router)
        first = await proxy.generate(GenerateRequest(request_id="turn-1", prompt=prompt,
                                                     params=SamplingParams(max_tokens=12, top_p=0.9, seed=1)))
        assert first.engine_ids == ["engine-a"]
        context = prompt + list(first.span.token_ids()) + [40, 41, 42]  # + a tool result
        started, streaming = asyncio.Event(), asyncio.Event()
        seen = [0]

        def on_event(event):
            seen[0] += len(event.tokens)
            started.set()
            if seen[0] >= 10:
                streaming.set()

        async def others_then_kill() -> tuple[list, dict]:
            await started.wait()  # the next turn streams from A; the others go to B, A, B (least loaded)
            others = [asyncio.ensure_future(proxy.generate(request)) for request in requests[1:]]
            await streaming.wait()
            health = await engines[0].health()
            servers["engine-a"].kill()
            return list(await asyncio.gather(*others)), health

        requests = [turn("turn-2", context, 2)] + [turn(f"other-{index}", [1, 9, index + 3], 10 + index)
                                                   for index in range(3)]
        next_turn, (others, health) = await asyncio.gather(proxy.generate(requests[0], on_event=on_event),
                                                           others_then_kill())
        return requests, [next_turn, *others], health

    requests, results, health_before_kill = asyncio.run(scenario())
    assert health_before_kill["reused_tokens"] > 0, "the next turn did not reuse its kept prefix on engine A"
    assert health_before_kill["running"] >= 2  # it was batched with another request when A died
    assert servers["engine-a"].process.poll() is not None
    assert results[0].engine_ids == ["engine-a", "engine-b"] and results[0].resumes == 1
    assert_every_token_replays(tiny_model_dir, requests, results, length=120)
    asyncio.run(router.close())


# ---------------------------------------------------------------------------- group calls
class CountingEngine(FailingEngine):
    """Counts the calls it gets: single streams, and group calls with their sizes."""

    def __init__(self, inner, **kwargs):
        super().__init__(inner, **kwargs)
        self.group_sizes: list[int] = []

    async def stream_group(self, requests):
        self.group_sizes.append(len(requests))
        if self.fail_before_first > 0:   # the whole call refused (connection refused)
            self.fail_before_first -= 1
            raise EngineDied(f"{self.engine_id} refused the group")
        async for item in super().stream_group(requests):
            yield item


def _sample(index: int, prompt=(1, 9, 4), max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(request_id=f"s{index}", prompt=list(prompt),
                           params=SamplingParams(max_tokens=max_tokens, seed=100 + index, top_p=0.9))


def test_the_proxy_sends_a_groups_samples_started_together_as_one_call():
    """8 samples of one prompt started at once: one group call (the other prompt's two samples another),
    and every result is the one the request gets alone."""
    model = tiny_llama(seed=0)
    counting = CountingEngine(TorchEngine(model, engine_id="a"))
    proxy = TokenRecordingProxy(counting)
    requests = [_sample(index) for index in range(8)] + [_sample(8 + index, prompt=(1, 5)) for index in range(2)]

    async def together():
        return await asyncio.gather(*(proxy.generate(request) for request in requests))

    results = asyncio.run(together())
    assert sorted(counting.group_sizes) == [2, 8] and proxy.group_calls_made == 2
    alone = TokenRecordingProxy(TorchEngine(model, engine_id="b"), group_calls=False)
    for request, result in zip(requests, results):
        expected = asyncio.run(alone.generate(request))
        assert list(result.span.token_ids()) == list(expected.span.token_ids()) and result.resumes == 0
        torch.testing.assert_close(recorded(result.span), replayed(model, request.prompt, result.span), atol=2e-4, rtol=0)
    sequential = [asyncio.run(proxy.generate(request)) for request in requests[:2]]   # not together: alone
    assert sorted(counting.group_sizes) == [2, 8] and len(sequential) == 2


def test_a_cancelled_sample_of_a_group_call_leaves_the_others_running():
    model = tiny_llama(seed=0)
    proxy = TokenRecordingProxy(TorchEngine(model, engine_id="a"))

    async def one_cancelled():
        jobs = [asyncio.ensure_future(proxy.generate(_sample(index, max_tokens=30))) for index in range(3)]
        await asyncio.sleep(0)
        jobs[1].cancel()
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(one_cancelled())
    assert isinstance(results[1], asyncio.CancelledError)
    assert all(len(results[index].span) == 30 for index in (0, 2))


def test_a_group_cut_off_by_its_engines_death_resumes_each_unfinished_sample_alone():
    """The group's engine dies after 3 tokens of each stream: every sample resumes on the other engine
    with its tokens so far, and every token is the one the trainer's replay expects."""
    model = tiny_llama(seed=0)
    dying = CountingEngine(TorchEngine(model, engine_id="a"), fail_after_tokens=3)
    survivor = CountingEngine(TorchEngine(model, engine_id="b"))
    router = Router([dying, survivor], policy="round-robin", down_for_s=60)
    requests = [_sample(index, max_tokens=25) for index in range(4)]
    results = asyncio.run(TokenRecordingProxy(router).generate_group(requests))
    assert dying.group_sizes == [4] and survivor.group_sizes == []   # the group went to one engine, whole
    for request, result in zip(requests, results):
        assert len(result.span) == 25 and result.span.finish_reason == "length"
        assert result.engine_ids == ["a", "b"] and result.resumes == 1
        torch.testing.assert_close(recorded(result.span), replayed(model, request.prompt, result.span), atol=2e-4, rtol=0)
        result.span.check()
    asyncio.run(router.close())


def test_a_group_refused_before_its_first_token_is_retried_whole_elsewhere():
    model = tiny_llama(seed=0)
    refusing = CountingEngine(TorchEngine(model, engine_id="a"), fail_before_first=1)
    other = CountingEngine(TorchEngine(model, engine_id="b"))
    router = Router([refusing, other], policy="round-robin", down_for_s=60)
    results = asyncio.run(TokenRecordingProxy(router).generate_group([_sample(index) for index in range(3)]))
    assert refusing.group_sizes == [3] and other.group_sizes == [3]
    assert all(result.engine_ids == ["b"] and result.resumes == 0 for result in results)
    asyncio.run(router.close())


def test_killing_an_engine_process_mid_group_call_loses_nothing_the_proxy_cannot_resume(engine_server_factory,
                                                                                       tiny_model_dir):
    """A group call of 4 samples streams over HTTP from engine A, which is SIGKILLed mid-generation: each
    sample resumes alone on engine B, and every token matches the reference model's replay."""

    every_token = ("--engine-options", '{"stream_interval_s": 0}')
    servers = {name: engine_server_factory(name, *every_token) for name in ("engine-a", "engine-b")}
    engines = [HttpEngine(server.url, engine_id=name) for name, server in servers.items()]
    router = Router(engines, policy="least-loaded", down_for_s=60)   # idle engines: the first (A) is picked
    requests = [GenerateRequest(request_id=f"g{index}", prompt=[1, 17, 23, 5],
                                params=SamplingParams(max_tokens=120, top_p=0.9, seed=50 + index)) for index in range(4)]

    class KillingRouter(InferenceEngine):
        """The router, except that engine A is SIGKILLed once the group has streamed 20 tokens."""

        engine_id = "killing-router"

        async def stream_group(self, group):
            seen = 0
            async for index, event in router.stream_group(group):
                seen += len(event.tokens)
                if seen >= 20 and servers["engine-a"].process.poll() is None:
                    servers["engine-a"].kill()
                yield index, event

        def stream(self, request):  # the resumed samples go through the router as they are
            return router.stream(request)

    results = asyncio.run(TokenRecordingProxy(KillingRouter()).generate_group(requests))
    assert servers["engine-a"].process.poll() is not None
    assert any(result.engine_ids == ["engine-a", "engine-b"] for result in results)
    assert_every_token_replays(tiny_model_dir, requests, results, length=120)
    asyncio.run(router.close())


def assert_every_token_replays(model_dir, requests, results, *, length: int) -> None:
    """Every result ran its whole budget, and each token's recorded logprob is the reference model's
    replay of it (whichever engine sampled it, resumed or not)."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    for request, result in zip(requests, results, strict=True):
        assert len(result.span) == length and result.span.finish_reason == "length"
        torch.testing.assert_close(recorded(result.span), replayed(reference, request.prompt, result.span),
                                   atol=2e-4, rtol=0)
        result.span.check()
