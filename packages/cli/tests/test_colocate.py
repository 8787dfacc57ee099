"""``[rollout] colocate``: the engine on the trainer's own parameters, updated by the optimiser step itself.

The end-to-end run (one process, SIGKILLed and resumed exactly-once) is in test_run.py.
"""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest
import torch

from relayrl.algo.sampling import KeptSets, replay_logprobs
from relayrl.cli.run.colocate import ColocatedFleet, colocation_problem, shared_view
from relayrl.core.config import ConfigError, load_config
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.testing.models import tiny_llama
from relayrl.trainer.torch_backend import TorchTrainer

FRESH_MODEL = {"tokenizer": "char", "chat_format": "raw", "init": {"hidden_size": 32, "num_hidden_layers": 1}}


def colocated_config(**rollout):
    return load_config({"model": FRESH_MODEL, "rollout": {"colocate": True, **rollout},
                        "algo": {"optimizer": {"lr": 0.05, "muon": False}}})


def test_a_shared_view_holds_the_trainers_tensors_in_modules_of_its_own():
    model = tiny_llama(seed=1).train()
    view = shared_view(model)
    for (name, tensor), (_, seen) in zip(model.state_dict().items(), view.state_dict().items(), strict=True):
        assert tensor.data_ptr() == seen.data_ptr(), name  # the same storage: no second copy of the weights
    for (name, buffer), (_, seen) in zip(model.named_buffers(), view.named_buffers(), strict=True):
        assert buffer is seen, name  # non-persistent buffers too (rotary frequencies)
    view.eval()
    assert model.training and not view.training  # its own modules
    # An in-place optimiser step on the trainer's parameters is what the view computes with.
    prompt = torch.tensor([[3, 4, 5, 6]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(prompt).logits.sum().backward()
    before = view(prompt).logits.detach().clone()
    optimizer.step()
    with torch.no_grad():
        assert not torch.allclose(view(prompt).logits, before)
        assert torch.equal(view(prompt).logits, model.eval()(prompt).logits)


def test_tokens_sampled_while_the_trainer_steps_record_the_weights_that_computed_them():
    """The engine decodes while the optimiser changes its (shared) parameters from another thread: every
    token's recorded logprob is the one its recorded version's weights give (so no decode step saw
    weights half-updated, and no token records a version other than its own)."""
    model = tiny_llama(seed=2, hidden_size=64)
    config = colocated_config()
    trainer = TorchTrainer(model, algo=config.algo, version=1)
    fleet = ColocatedFleet(None, config, trainer)
    trainer.weight_guard = fleet.guard  # what start() installs, without the rollout thread
    snapshots = {1: {name: tensor.clone() for name, tensor in model.state_dict().items()}}
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=48, stop_token_ids=[])
    requests = [GenerateRequest(request_id=f"r{index}", prompt=[3 + index % 7, 5, 9], params=msgspec.structs.replace(params, seed=index))
                for index in range(12)]
    done = threading.Event()

    async def generate():
        results = {index: ([], [], [], []) for index in range(len(requests))}
        async for index, event in fleet.engine.stream_group(requests):
            tokens, logprobs, versions, kept = results[index]
            tokens += event.tokens
            logprobs += event.logprobs
            versions += event.versions
            kept += event.kept
        done.set()
        return results

    def train():
        generator = torch.Generator().manual_seed(0)
        while not done.is_set() and trainer.version < 12:
            for parameter in model.parameters():
                parameter.grad = torch.randn(parameter.shape, generator=generator)
            trainer.apply_gradients()
            snapshots[trainer.version] = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    stepper = threading.Thread(target=train)
    stepper.start()
    try:
        results = asyncio.run(generate())
    finally:
        done.set()
        stepper.join()
        asyncio.run(fleet.engine.close())
    assert fleet.engine.served_version == trainer.version
    seen_versions = {version for _, _, versions, _ in results.values() for version in versions}
    assert len(seen_versions) >= 2, f"the trainer never stepped while the engine decoded: {seen_versions}"
    replica = tiny_llama(seed=2, hidden_size=64)
    for index, (tokens, logprobs, versions, kept) in results.items():
        logits = replay_decoding(replica, requests[index].prompt, tokens, versions, snapshots)
        offsets = torch.tensor([0, *torch.tensor([len(ids) for ids in kept]).cumsum(0).tolist()])
        kept_sets = KeptSets(offsets, torch.tensor([token for ids in kept for token in ids], dtype=torch.long))
        replayed = replay_logprobs(logits, torch.tensor(tokens), kept_sets)
        torch.testing.assert_close(replayed, torch.tensor(logprobs), atol=2e-4, rtol=0, msg=f"request {index}")


def replay_decoding(model, prompt, tokens, versions, snapshots):
    """The logits of every token as the engine computes them, one forward per token with the weights of the
    version the token records, over the KV cache of the forwards before (an in-flight request carries
    on with the new weights over the keys and values the old ones computed)."""
    from transformers import DynamicCache

    from relayrl.rollout.engines.torch_engine import cache_keyword

    cache, keyword, logits = DynamicCache(), cache_keyword(model), []
    inputs = [prompt] + [[token] for token in tokens[:-1]]
    with torch.no_grad():
        for fed, version in zip(inputs, versions, strict=True):
            model.load_state_dict(snapshots[version])
            output = model(torch.tensor([fed]), use_cache=True, **{keyword: cache})
            logits.append(output.logits[0, -1])
    return torch.stack(logits)


def test_a_token_sampled_after_an_update_landed_records_the_version_its_forward_ran_on():
    """An update between a forward and the sampling of its logits (the weights are only locked during the
    forward) must not stamp the new version on tokens the old weights computed."""

    class UpdatedBeforeSampling(TorchEngine):
        def _sample(self, rows, logits):
            self.pause()  # the worker is between its forward and the sampling: the update lands here
            self.set_served_version(self.served_version + 1)
            self.resume()
            return super()._sample(rows, logits)

    engine = UpdatedBeforeSampling(tiny_llama(seed=3), version=5)

    async def generate():
        request = GenerateRequest(request_id="r", prompt=[3, 4], params=SamplingParams(max_tokens=3, stop_token_ids=[]))
        versions = []
        async for event in engine.stream(request):
            versions += event.versions
        await engine.close()
        return versions

    # Each forward ran on the version before the update that landed after it.
    assert asyncio.run(generate()) == [5, 6, 7]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"trainer": {"ranks": 2}}, "rollout.colocate: needs trainer.ranks = 1"),
    ({"rollout": {"colocate": True, "engine_dtype": "bfloat16"}}, "rollout.engine_dtype = 'bfloat16'"),
])
def test_colocation_is_refused_where_one_process_cannot_hold_both(overrides, message):
    config = load_config({"model": FRESH_MODEL, "rollout": {"colocate": True}, **overrides})
    assert message in colocation_problem(config)


def test_colocation_needs_one_torch_engine_in_the_trainers_process():
    with pytest.raises(ConfigError, match="rollout.colocate: .* needs engine = \"torch\" and engines = 1"):
        colocated_config(engines=2)
    assert colocation_problem(load_config({"model": FRESH_MODEL})) is None
