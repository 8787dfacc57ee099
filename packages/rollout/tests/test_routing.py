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
