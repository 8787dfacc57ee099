"""Muon/AdamW split, and bitwise-reproducible training steps."""

from __future__ import annotations

import pytest
import torch

from relayrl.algo.determinism import enable_determinism, rng_state, set_rng_state
from relayrl.algo.optim import OptimizerSection, build_optimizer, muon_available


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=32, width=16):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(2)])
        self.norm = torch.nn.LayerNorm(width)
        self.dropout = torch.nn.Dropout(0.2)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied

    def forward(self, tokens):
        hidden = self.embed_tokens(tokens)
        for layer in self.layers:
            hidden = self.dropout(torch.relu(layer(hidden)))
        return self.lm_head(self.norm(hidden))


@pytest.mark.skipif(not muon_available(), reason="this torch has no torch.optim.Muon")
def test_split_by_name_and_shape():
    model = TinyLM()
    optimizer, report = build_optimizer(model, OptimizerSection(lr=1e-3))
    assert [name for name, _ in report.muon] == ["layers.0.weight", "layers.1.weight"]
    assert [name for name, _ in report.adamw] == ["embed_tokens.weight", "layers.0.bias", "layers.1.bias",
                                                  "norm.weight", "norm.bias"]  # the tied head appears once
    assert report.numel("muon") == 2 * 16 * 16
    assert set(optimizer.optimizers) == {"muon", "adamw"}
    assert "Muon: 2 tensors, 512 parameters" in report.summary()
    patterns = OptimizerSection(adamw_patterns=[*OptimizerSection().adamw_patterns, r"layers\.1\."])
    assert [name for name, _ in build_optimizer(model, patterns)[1].muon] == ["layers.0.weight"]


def test_muon_off_puts_everything_on_adamw():
    _, report = build_optimizer(TinyLM(), OptimizerSection(muon=False))
    assert report.muon == [] and len(report.adamw) == 7


def train_step(seed: int) -> dict[str, torch.Tensor]:
    enable_determinism(seed, num_threads=1)
    model = TinyLM()
    optimizer, _ = build_optimizer(model, OptimizerSection(lr=1e-2))
    tokens = torch.randint(0, 32, (4, 12))
    for _ in range(2):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: parameter.detach().clone() for name, parameter in model.state_dict().items()}


def test_identical_steps_give_bitwise_identical_parameters():
    first, second = train_step(11), train_step(11)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    # The check has teeth: another seed (init, data, dropout) changes the weights.
    other = train_step(12)
    assert any(not torch.equal(first[name], other[name]) for name in first)


def test_rng_state_round_trip():
    enable_determinism(3)
    state = rng_state()
    expected = (torch.rand(3), __import__("random").random())
    set_rng_state(state)
    assert torch.equal(torch.rand(3), expected[0]) and __import__("random").random() == expected[1]


def test_optimizer_state_round_trip():
    model = TinyLM()
    optimizer, _ = build_optimizer(model, OptimizerSection(lr=1e-2))
    model(torch.randint(0, 32, (2, 5))).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    again, _ = build_optimizer(model, OptimizerSection(lr=1e-2))
    again.load_state_dict(state)
    with pytest.raises(ValueError, match="optimizer state has"):
        again.load_state_dict({"adamw": state["adamw"]})
