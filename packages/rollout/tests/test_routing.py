"""Routers against the router suite, and the token-recording proxy against a killed engine process."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import EngineDied, GenerateRequest, SamplingParams
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
    from transformers import AutoModelForCausalLM

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
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()
    for request, result in zip(requests, results):
        assert len(result.span) == 120 and result.span.finish_reason == "length"
        torch.testing.assert_close(recorded(result.span), replayed(reference, request.prompt, result.span),
                                   atol=2e-4, rtol=0)
        result.span.check()
    asyncio.run(router.close())
