"""The torch engine kept current by relayrl-weight-sync: in process, and inside the engine server."""

from __future__ import annotations

import asyncio
import copy
import json
import time

import torch

from relayrl.core.store import open_store
from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.engines.torch_engine import TorchEngine, TorchEngineAdapter
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.testing import tiny_llama
from relayrl.rollout.testing.engine_tests import recorded, replayed
from relayrl.rollout.testing.servers import EngineServer
from relayrl.rollout.weights import adapter_for
from relayrl.weight_sync import Controller, EngineAdapter, Publisher, ShadowAdapter, WeightLoader

PROMPT = [1, 11, 22, 33]


def train_a_little(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))


def generate(engine, seed=1):
    return asyncio.run(engine.generate(GenerateRequest(request_id=f"g{seed}", prompt=PROMPT,
                                                       params=SamplingParams(max_tokens=12, top_p=0.9, seed=seed))))


def test_controller_updates_the_engine_in_place(tmp_path):
    trainer_model = tiny_llama(seed=0)
    engine = TorchEngine(copy.deepcopy(trainer_model), version=0)
    store = open_store(str(tmp_path / "bus"))
    publisher = Publisher(store, background=False)
    adapter = adapter_for(engine)
    assert isinstance(adapter, TorchEngineAdapter) and isinstance(adapter, EngineAdapter)
    controller = Controller(store, adapter, reset_caches_on_apply=True)

    publisher.publish(trainer_model.state_dict()).result()
    first = controller.poll_once()
    assert first.version == 1 and first.route == "snapshot" and engine.served_version == 1

    train_a_little(trainer_model, seed=1)
    publisher.publish(trainer_model.state_dict()).result()
    before = engine.cache_generation
    second = controller.poll_once()
    assert second.version == 2 and second.route == "delta" and second.pause_s >= 0
    assert engine.served_version == 2 and engine.cache_generation == before + 1
    span = generate(engine)
    assert set(span.token_versions()) == {2}
    torch.testing.assert_close(recorded(span), replayed(trainer_model, PROMPT, span), atol=2e-4, rtol=0)
    assert controller.poll_once() is None  # nothing newer
    publisher.close()
    controller.close()
    asyncio.run(engine.close())


class Repacking(TorchEngine):
    """A torch engine that, like vLLM, only takes weights through load_weights (no raw tensors)."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.pushed: list[tuple[list[str], int]] = []

    def load_weights(self, tensors, version):
        self.pushed.append((sorted(tensors), version))
        super().load_weights(tensors, version)

    def weight_adapter(self):
        shadow = {name: value.detach().clone() for name, value in self.model.state_dict().items()}
        return ShadowAdapter(self, shadow)


def test_shadow_adapter_applies_deltas_to_the_shadow_and_pushes_the_changed_tensors(tmp_path):
    trainer_model = tiny_llama(seed=0)
    engine = Repacking(copy.deepcopy(trainer_model), version=0)
    adapter = adapter_for(engine)
    # One protocol, one spelling: the engine is a WeightLoader, the adapter weight-sync's EngineAdapter.
    assert isinstance(engine, WeightLoader) and isinstance(adapter, ShadowAdapter) and isinstance(adapter, EngineAdapter)
    store = open_store(str(tmp_path / "bus"))
    publisher = Publisher(store, background=False)
    controller = Controller(store, adapter, reset_caches_on_apply=True)

    publisher.publish(trainer_model.state_dict()).result()
    assert controller.poll_once().route == "snapshot" and engine.served_version == 1
    with torch.no_grad():  # only one tensor changes: only it is pushed
        trainer_model.model.norm.weight.add_(0.5)
    publisher.publish(trainer_model.state_dict()).result()
    before = engine.cache_generation
    assert controller.poll_once().route == "delta"
    assert engine.pushed[-1] == (["model.norm.weight"], 2) and engine.served_version == 2
    assert engine.cache_generation > before and not engine.paused
    torch.testing.assert_close(engine.model.model.norm.weight, trainer_model.model.norm.weight, rtol=0, atol=0)
    span = generate(engine)
    assert set(span.token_versions()) == {2}
    torch.testing.assert_close(recorded(span), replayed(trainer_model, PROMPT, span), atol=2e-4, rtol=0)
    publisher.close()
    controller.close()
    asyncio.run(engine.close())


def test_engine_server_follows_the_bus(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()
    bus = tmp_path / "bus"
    # The controller is built from a [weight_sync] section (relayrl run passes the run's): non-default
    # values must reach it; --poll-interval overrides the section's.
    section = {"apply_mode": "xor", "verify_after_apply": False, "reset_caches_on_apply": False}
    server = EngineServer(tiny_model_dir, "follower", "--bus", str(bus), "--weight-sync", json.dumps(section),
                          "--poll-interval", "0.1")
    try:
        publisher = Publisher(open_store(str(bus)), background=False)
        for seed in (1, 2):
            train_a_little(trainer_model, seed)
            publisher.publish(trainer_model.state_dict()).result()
        client = HttpEngine(server.url)
        deadline = time.monotonic() + 60
        while asyncio.run(client.health()).get("version") != 2:
            assert time.monotonic() < deadline, "the engine server never applied version 2"
            time.sleep(0.1)
        span = generate(client, seed=3)
        assert set(span.token_versions()) == {2}
        # /health carries the engine's last weight update, timed (the run's status and report show it).
        updates = asyncio.run(client.health())["weight_sync"]
        assert updates["version"] == 2 and updates["updates"] >= 1 and not updates["held_paused"]
        assert updates["pause_s"] > 0 and updates["total_s"] >= updates["fetch_s"] > 0
        assert updates["settings"] == {"source": bus.as_uri(), "prefix": "weights", **section, "poll_interval_s": 0.1}
        torch.testing.assert_close(recorded(span), replayed(trainer_model, PROMPT, span), atol=2e-4, rtol=0)
        publisher.close()
        asyncio.run(client.close())
    finally:
        server.stop()
