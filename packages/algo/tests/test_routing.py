"""MoE routing capture and forced routing on a real transformers Qwen3-MoE model."""

import threading
from collections import Counter

import pytest
import torch
import transformers

from relayrl.algo.routing import RoutingCapture, moe_routers, recorded_routing, replay_gates


def tiny_moe(seed: int = 0, layers: int = 2):
    config = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, intermediate_size=128,
                                         moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                         norm_topk_prob=True, decoder_sparse_step=1, max_position_embeddings=128)
    torch.manual_seed(seed)
    return transformers.Qwen3MoeForCausalLM(config).eval()


def tokens(seed: int = 1, shape=(3, 12)):
    return torch.randint(3, 64, shape, generator=torch.Generator().manual_seed(seed))


def captured(model, input_ids):
    routers = moe_routers(model)
    with torch.no_grad(), RoutingCapture(routers) as capture:
        logits = model(input_ids=input_ids).logits
    return logits, capture.take().reshape(*input_ids.shape, len(routers), -1)


def test_routers_are_found_in_layer_order_and_a_dense_model_has_none():
    routers = moe_routers(tiny_moe(layers=3))
    assert [router.name for router in routers] == [f"model.layers.{i}.mlp.gate" for i in range(3)]
    assert {(router.num_experts, router.top_k, router.normalizes) for router in routers} == {(8, 2, True)}
    dense = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                                   num_attention_heads=2, intermediate_size=64))
    assert moe_routers(dense) == []


def test_a_capture_records_only_the_forwards_of_the_thread_that_entered_it():
    # Two engines serving one model object from two threads: each capture must see its own forwards.
    model = tiny_moe()
    routers = moe_routers(model)
    mine, theirs = tokens(seed=1, shape=(1, 5)), tokens(seed=2, shape=(2, 7))
    with torch.no_grad(), RoutingCapture(routers) as capture:
        other = threading.Thread(target=lambda: model(input_ids=theirs))
        other.start()
        other.join()
        with pytest.raises(RuntimeError, match="did not run"):
            capture.take()
        model(input_ids=mine)
        assert capture.take().shape[0] == mine.numel()


def test_replayed_gates_of_the_routers_own_choice_are_bitwise_its_gates():
    router = moe_routers(tiny_moe())[0]
    hidden = torch.randn(50, 64)
    logits, gates, experts = router.module(hidden)
    assert torch.equal(replay_gates(logits, experts, normalizes=True), gates)


def test_forcing_the_recorded_routing_of_the_same_forward_reproduces_its_logits_bitwise():
    model, input_ids = tiny_moe(), tokens()
    reference, experts = captured(model, input_ids)
    stats = Counter()
    with torch.no_grad(), recorded_routing(moe_routers(model), experts, torch.ones(input_ids.shape, dtype=torch.bool),
                                           stats=stats):
        forced = model(input_ids=input_ids).logits
    assert torch.equal(forced, reference)
    assert stats["routing/compared"] == input_ids.numel() * 2 and stats["routing/set_differs"] == 0


def test_forced_routing_routes_recorded_positions_to_the_recorded_experts_and_leaves_the_others():
    model, input_ids = tiny_moe(), tokens()
    reference, own = captured(model, input_ids)
    # Another routing: every recorded expert moved to the next one.
    other = (own + 1) % 8
    other[..., 1] = torch.where(other[..., 1] == other[..., 0], (other[..., 1] + 1) % 8, other[..., 1])
    mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    mask[:, :6] = True  # only the first half of every row is recorded
    routers = moe_routers(model)
    stats = Counter()
    with torch.no_grad(), recorded_routing(routers, other, mask, stats=stats), RoutingCapture(routers) as capture:
        forced = model(input_ids=input_ids).logits
    used = capture.take().reshape(*input_ids.shape, len(routers), -1)
    assert torch.equal(used[:, :6], other[:, :6])
    assert stats["routing/set_differs"] == stats["routing/compared"] == mask.sum() * len(routers)
    assert not torch.allclose(forced, reference)
    # Causal: the unrecorded second half sees different hidden states from the forced first half, but
    # layer 0 routes from the embeddings alone, so there the router's own choice must stand.
    assert torch.equal(used[:, 6:, 0], own[:, 6:, 0])


def test_comparing_without_forcing_changes_nothing_and_still_counts_disagreements():
    model, input_ids = tiny_moe(), tokens()
    reference, own = captured(model, input_ids)
    other = own.flip(-1)  # the same sets, first choice swapped
    stats = Counter()
    with torch.no_grad(), recorded_routing(moe_routers(model), other, torch.ones(input_ids.shape, dtype=torch.bool),
                                           force=False, stats=stats):
        logits = model(input_ids=input_ids).logits
    assert torch.equal(logits, reference)
    assert stats["routing/top1_differs"] == stats["routing/compared"] and stats["routing/set_differs"] == 0


def test_gradients_reach_the_router_through_the_forced_experts_logits():
    model, input_ids = tiny_moe(), tokens()
    _, own = captured(model, input_ids)
    routers = moe_routers(model)
    with recorded_routing(routers, (own + 3) % 8, torch.ones(input_ids.shape, dtype=torch.bool)):
        model(input_ids=input_ids).logits.logsumexp(-1).sum().backward()
    for router in routers:
        assert router.module.weight.grad is not None and router.module.weight.grad.abs().sum() > 0


def test_a_record_for_another_number_of_layers_or_layout_is_refused():
    model, input_ids = tiny_moe(), tokens()
    _, own = captured(model, input_ids)
    routers = moe_routers(model)
    with pytest.raises(ValueError, match="2 MoE layers"), \
            recorded_routing(routers[:1], own, torch.ones(input_ids.shape, dtype=torch.bool)):
        pass
    with pytest.raises(RuntimeError, match="routed rows"), torch.no_grad(), \
            recorded_routing(routers, own[:, :6], torch.ones((3, 6), dtype=torch.bool)):
        model(input_ids=input_ids)
