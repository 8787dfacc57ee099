"""The supervised warm-up: single answers and multi-turn masked examples train exactly their trained tokens."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from relayrl.trainer.config import WarmupSection
from relayrl.trainer.warmup import MaskedExample, _pad, supervised_warmup


def test_masked_examples_label_only_their_trained_tokens():
    pairs = [([1, 2, 3], [4, 5])]
    masked = [MaskedExample([1, 2, 3, 4, 5, 6], [False, True, False, False, True, True])]
    _, labels, attention = _pad(pairs + masked, pad=0)
    assert labels[0].tolist() == [-100, -100, -100, 4, 5, -100]
    assert labels[1].tolist() == [-100, 2, -100, -100, 5, 6]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="3 tokens but 2"):
        MaskedExample([1, 2, 3], [True, False])


@pytest.mark.parametrize("options", [{}, {"muon": True, "muon_lr": 2e-2, "decay": "cosine"}], ids=["adamw", "muon-cosine"])
def test_warmup_learns_a_multi_turn_pattern_only_where_trained(options):
    """Tool results (untrained) are random; the turns after them are a fixed reply: only those are learned."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=32))
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(64):
        noise = torch.randint(8, 16, (4,), generator=generator).tolist()
        examples.append(MaskedExample([1, 2, 3, *noise, 4, 5, 6], [False, True, True, *[False] * 4, False, True, True]))
    losses = supervised_warmup(model, examples, WarmupSection(steps=60, batch_size=16, lr=1e-2, **options), seed=0)
    assert losses[-1] < 0.1 < losses[0]  # the trained tokens are predictable; the untrained noise never counted


def test_the_learning_rate_ramps_then_decays_to_a_tenth():
    from relayrl.trainer.warmup import _lr_factor

    section = WarmupSection(steps=100, ramp=0.1, decay="cosine")
    factors = [_lr_factor(step, section) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(factors[10:])) and factors[-1] == pytest.approx(0.1, abs=0.01)
    assert {_lr_factor(step, WarmupSection(steps=100)) for step in range(10, 100)} == {1.0}


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    from relayrl.trainer.warmup import _warmup_optimizers

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=32))
    groups = _warmup_optimizers(model, WarmupSection(lr=1e-3, muon=True, muon_lr=2e-2))
    kinds = {type(optimizer).__name__: base for optimizer, base in groups}
    assert kinds == {"Muon": 2e-2, "AdamW": 1e-3}
    covered = [p for optimizer, _ in groups for group in optimizer.param_groups for p in group["params"]]
    assert len(covered) == len(list(model.parameters()))


@pytest.mark.parametrize(("options", "key"), [({"decay": "linear"}, "decay"), ({"ramp": 1.5}, "ramp")])
def test_bad_warmup_options_name_their_key(options, key):
    from relayrl.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"trainer\.warmup\.{key}"):
        load_config({"trainer": {"warmup": options}})
