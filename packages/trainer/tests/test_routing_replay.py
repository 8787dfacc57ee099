"""Routing replay in the trainer: spans sampled by the real torch engine from a Qwen3 mixture of experts,
trained on by the torch backend with ``[algo] routing_replay`` on and off."""

from __future__ import annotations

import copy

import msgspec
import pytest
import torch

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.core.wire import ExpertRouting
from relayrl.rollout.testing import tiny_moe
from relayrl.rollout.testing.groups import generate_groups
from relayrl.trainer.batch import build_sequences, split_by_token_budget
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer


def trainer_metrics(model: torch.nn.Module, groups, *, replay: bool, micro_batch_tokens: int = 4096) -> dict[str, float]:
    """One batch's forward and backward (no step) on a copy of ``model``; its metrics."""
    algo = AlgoSection(routing_replay=replay, sampling=SamplingSection(top_p=0.9))
    trainer = TorchTrainer(copy.deepcopy(model), algo=algo, config=TrainerSection(micro_batch_tokens=micro_batch_tokens))
    return trainer.accumulate_gradients(groups)


@pytest.fixture(scope="module")
def moe():
    return tiny_moe(seed=0, layers=2)


@pytest.fixture(scope="module")
def fp32_groups(moe):
    return generate_groups(copy.deepcopy(moe), groups=3, size=4, max_tokens=12, top_p=0.9)


def test_every_position_but_each_sequences_last_has_the_engines_routing(fp32_groups):
    batch = build_sequences(fp32_groups)
    lengths = batch.attention_mask.sum(dim=1)
    assert batch.routing is not None and batch.routing.shape[2:] == (2, 2) and batch.routing_dropped == 0
    for row, length in enumerate(lengths.tolist()):
        assert batch.routing_mask[row, : length - 1].all() and not batch.routing_mask[row, length - 1:].any()
    # Micro-batches carry their rows' routing.
    for rows, micro in split_by_token_budget(batch, 40):
        assert torch.equal(micro.routing, batch.routing[rows, : micro.input_ids.shape[1]])


def test_a_record_that_does_not_line_up_with_its_sequence_is_dropped_not_misapplied(fp32_groups):
    group = fp32_groups[0]
    trajectory = group.trajectories[0]
    turns = trajectory.segments[0].turns
    span = turns[1].generated
    shifted = msgspec.structs.replace(span.routing, first_generated=span.routing.first_generated + 1,
                                      experts=span.routing.experts[: len(span.routing.experts) - 4])
    bad = msgspec.structs.replace(trajectory, segments=[msgspec.structs.replace(
        trajectory.segments[0], turns=[turns[0], msgspec.structs.replace(turns[1], generated=msgspec.structs.replace(
            span, routing=shifted))])])
    batch = build_sequences([msgspec.structs.replace(group, trajectories=[bad, *group.trajectories[1:]])])
    assert batch.routing_dropped == 1 and not batch.routing_mask[0].any() and batch.routing_mask[1:].any()


def test_with_the_engines_precision_forced_routing_reproduces_its_logprobs(moe, fp32_groups):
    for micro_batch_tokens in (4096, 40):  # one micro-batch, and several
        metrics = trainer_metrics(moe, fp32_groups, replay=True, micro_batch_tokens=micro_batch_tokens)
        assert metrics["routing/replayed"] == 1.0
        assert metrics["mismatch/abs_log_ratio"] < 2e-5, metrics
        assert abs(metrics["mismatch/ratio_max"] - 1) < 2e-4 and abs(metrics["mismatch/ratio_min"] - 1) < 2e-4


def test_a_bfloat16_engine_routes_differently_and_replay_shrinks_the_mismatch(moe):
    engine_model = copy.deepcopy(moe).to(torch.bfloat16)
    groups = generate_groups(engine_model, groups=4, size=8, max_tokens=16, top_p=0.9)
    own = trainer_metrics(moe, groups, replay=False)
    replayed = trainer_metrics(moe, groups, replay=True)
    # The same comparison both ways: the trainer's own routers disagree with the bf16 engine somewhere.
    assert own["routing/set_differs"] == replayed["routing/set_differs"] > 0
    assert replayed["mismatch/kl_k3"] < own["mismatch/kl_k3"]
    assert replayed["mismatch/abs_log_ratio"] < own["mismatch/abs_log_ratio"]


def test_a_dense_model_trains_as_before_whatever_the_setting():
    from relayrl.rollout.testing import tiny_llama

    model = tiny_llama(seed=0)
    groups = generate_groups(copy.deepcopy(model), groups=2, size=4, max_tokens=8)
    assert build_sequences(groups).routing is None
    off, on = trainer_metrics(model, groups, replay=False), trainer_metrics(model, groups, replay=True)
    assert off["loss/value"] == on["loss/value"] and not any(name.startswith("routing/") for name in on)


def test_routing_records_survive_the_wire(fp32_groups):
    from relayrl.core import codec, wire

    segment = wire.RolloutSegment(producer_id="p", sequence=0, groups=fp32_groups)
    decoded = codec.decode_compressed(codec.encode_compressed(segment), wire.RolloutSegment)
    before, after = build_sequences(fp32_groups), build_sequences(decoded.groups)
    assert torch.equal(before.routing, after.routing) and torch.equal(before.routing_mask, after.routing_mask)
    assert isinstance(decoded.groups[0].trajectories[0].segments[0].turns[1].generated.routing, ExpertRouting)
