"""Kept-set sampling and replay: hand-computed values, the replay property, exact zeros."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.algo.sampling import KeptSets, full_entropy, replay_logprobs, sample_tokens, truncate_logits


def log_softmax_over(values: list[float], index: int, temperature: float = 1.0) -> float:
    scaled = [value / temperature for value in values]
    top = max(scaled)
    return scaled[index] - (top + math.log(sum(math.exp(value - top) for value in scaled)))


def test_top_p_kept_set_and_logprob_by_hand():
    # p = softmax([2, 1, 0, -1]) = [0.6439, 0.2369, 0.0871, 0.0321]; top_p = 0.85 keeps the first
    # two (mass before the third is 0.8808 >= 0.85).
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    for seed in range(20):
        result = sample_tokens(logits, top_p=0.85, generator=torch.Generator().manual_seed(seed))
        assert result.kept.row(0) == [0, 1]
        token = int(result.tokens[0])
        assert token in (0, 1)
        expected = log_softmax_over([2.0, 1.0], token)  # renormalised over the kept pair
        assert result.logprobs[0].item() == pytest.approx(expected, abs=1e-6)
        assert result.kept_mass[0].item() == pytest.approx(math.exp(2) / sum(math.exp(v) for v in [2, 1, 0, -1]) +
                                                           math.exp(1) / sum(math.exp(v) for v in [2, 1, 0, -1]), abs=1e-6)


def test_temperature_top_k_then_top_p_over_the_renormalised_top_k():
    # temperature 2 → scaled [1, 0.5, 0, -0.5, -1]; top_k = 3 keeps [1, 0.5, 0] with renormalised
    # probabilities [0.5065, 0.3072, 0.1863]; top_p = 0.75 then keeps two (0.5065 < 0.75 <= 0.8137).
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0]])
    result = sample_tokens(logits, temperature=2.0, top_k=3, top_p=0.75, generator=torch.Generator().manual_seed(0))
    assert result.kept.row(0) == [0, 1]
    token = int(result.tokens[0])
    assert result.logprobs[0].item() == pytest.approx(log_softmax_over([2.0, 1.0], token, 2.0), abs=1e-6)


def test_max_kept_cap_and_its_bias_bound():
    # Uniform over 10 tokens, top_p = 0.95 wants 10 tokens; the cap keeps 4: kept mass 0.4, so the
    # sampled distribution is within TV 1 - 0.4 of the intended one.
    logits = torch.zeros(1, 10)
    result = sample_tokens(logits, top_p=0.95, max_kept=4, generator=torch.Generator().manual_seed(0))
    assert len(result.kept.row(0)) == 4
    assert result.kept_mass[0].item() == pytest.approx(0.4, abs=1e-6)
    assert result.cap_bias_bound[0].item() == pytest.approx(0.6, abs=1e-6)
    assert result.logprobs[0].item() == pytest.approx(math.log(1 / 4), abs=1e-6)
    # A cap that does not bind reports no bias.
    peaked = torch.tensor([[10.0] + [0.0] * 9])
    assert sample_tokens(peaked, top_p=0.9, max_kept=4).cap_bias_bound[0].item() == 0.0


def test_untruncated_sampling_stores_empty_rows_and_replays_over_the_full_vocabulary():
    logits = torch.randn(5, 17)
    result = sample_tokens(logits, generator=torch.Generator().manual_seed(0))
    assert result.kept.counts().tolist() == [0] * 5
    expected = torch.log_softmax(logits, dim=-1).gather(1, result.tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(result.logprobs, expected)
    torch.testing.assert_close(replay_logprobs(logits, result.tokens, result.kept), expected)


def test_greedy_is_a_singleton_with_logprob_zero():
    logits = torch.tensor([[0.1, 3.0, 2.9]])
    result = sample_tokens(logits, temperature=0.0)
    assert result.tokens.tolist() == [1] and result.kept.row(0) == [1] and result.logprobs.tolist() == [0.0]


def test_singleton_kept_set_gives_exactly_zero_logprob_and_gradient():
    logits = torch.tensor([[5.0, 1.0, 0.5], [0.3, 0.2, 0.1]], requires_grad=True)
    kept = KeptSets.from_rows([[0], [0, 1, 2]])
    tokens = torch.tensor([0, 2])
    logprobs = replay_logprobs(logits, tokens, kept)
    assert logprobs[0].item() == 0.0
    (logprobs * torch.tensor([3.0, 1.0])).sum().backward()
    assert torch.count_nonzero(logits.grad[0]) == 0
    # The other row: d log softmax(x)[2] / dx = onehot(2) - softmax(x).
    expected = -torch.softmax(logits.detach()[1], dim=-1)
    expected[2] += 1
    torch.testing.assert_close(logits.grad[1], expected)


def test_replay_gradient_matches_a_dense_masked_reference():
    torch.manual_seed(0)
    logits = torch.randn(30, 40, requires_grad=True)
    sample = sample_tokens(logits.detach(), top_p=0.8, temperature=0.7, generator=torch.Generator().manual_seed(1))
    replay_logprobs(logits, sample.tokens, sample.kept, temperature=0.7).sum().backward()
    sparse_grad = logits.grad.clone()

    dense = logits.detach().clone().requires_grad_()
    mask = torch.zeros(30, 40, dtype=torch.bool)
    for row in range(30):
        mask[row, sample.kept.row(row)] = True
    masked = (dense / 0.7).masked_fill(~mask, float("-inf"))
    torch.log_softmax(masked, dim=-1).gather(1, sample.tokens.unsqueeze(1)).sum().backward()
    torch.testing.assert_close(sparse_grad, dense.grad)


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 12), vocab=st.integers(1, 60), temperature=st.floats(0.2, 3.0),
       top_p=st.floats(0.05, 1.0), top_k=st.integers(0, 70), max_kept=st.none() | st.integers(1, 30),
       scale=st.floats(0.1, 8.0), seed=st.integers(0, 2**31 - 1))
def test_replay_equals_sampler_logprobs(rows, vocab, temperature, top_p, top_k, max_kept, scale, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * scale
    result = sample_tokens(logits, temperature=temperature, top_p=top_p, top_k=top_k, max_kept=max_kept,
                           generator=generator)
    replayed = replay_logprobs(logits, result.tokens, result.kept, temperature=temperature)
    torch.testing.assert_close(replayed, result.logprobs, rtol=0, atol=2e-5)
    counts = result.kept.counts()
    for row in range(rows):
        kept = result.kept.row(row)
        assert kept == [] or int(result.tokens[row]) in kept
        if counts[row] == 1:
            assert result.logprobs[row].item() == 0.0 and replayed[row].item() == 0.0
    limit = min(x for x in (top_k or vocab, max_kept or vocab, vocab))
    assert int(counts.max()) <= limit


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 8), vocab=st.integers(1, 60), temperature=st.floats(0.0, 3.0),
       top_p=st.floats(0.05, 1.0), top_k=st.integers(0, 70), max_kept=st.none() | st.integers(1, 30),
       scale=st.floats(0.1, 8.0), seed=st.integers(0, 2**31 - 1))
def test_truncated_logits_keep_exactly_the_samplers_kept_set(rows, vocab, temperature, top_p, top_k, max_kept,
                                                              scale, seed):
    """An engine that samples softmax(truncate_logits(...)) at temperature 1 samples the same distribution."""
    if 0 < temperature < 0.2:
        temperature = 0.2
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    truncated = truncate_logits(logits, temperature=temperature, top_p=top_p, top_k=top_k, max_kept=max_kept)
    result = sample_tokens(logits, temperature=temperature, top_p=top_p, top_k=top_k, max_kept=max_kept,
                           generator=torch.Generator().manual_seed(seed))
    logprobs = torch.log_softmax(truncated, dim=-1)
    torch.testing.assert_close(logprobs.gather(1, result.tokens.unsqueeze(1)).squeeze(1), result.logprobs,
                               rtol=0, atol=2e-5)
    for row in range(rows):
        finite = torch.isfinite(truncated[row]).nonzero().squeeze(1).tolist()
        kept = result.kept.row(row) or list(range(vocab))  # an empty row is the full vocabulary
        assert sorted(finite) == sorted(kept)


def test_kept_entropy_and_full_entropy_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25, 1e-9]]))
    kept = KeptSets.from_rows([[0, 1, 2]])
    _, entropy = replay_logprobs(logits, torch.tensor([0]), kept, return_kept_entropy=True)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert entropy.item() == pytest.approx(expected, abs=1e-5)
    assert full_entropy(logits).item() == pytest.approx(expected, abs=1e-5)


def test_kept_sets_concat_and_validation():
    a, b = KeptSets.from_rows([[1], [2, 3]]), KeptSets.from_rows([[], [4, 5, 6]])
    joined = KeptSets.concat([a, b])
    assert [joined.row(index) for index in range(4)] == [[1], [2, 3], [], [4, 5, 6]]
    # Views into a larger CSR (offsets not starting at 0) are rebased.
    view = KeptSets(joined.offsets[1:4], joined.ids)  # rows 1 and 2
    again = KeptSets.concat([view, KeptSets(joined.offsets[3:5], joined.ids)])  # + row 3
    assert [again.row(index) for index in range(3)] == [[2, 3], [], [4, 5, 6]]
    with pytest.raises(ValueError, match="shapes disagree"):
        replay_logprobs(torch.zeros(3, 5), torch.zeros(2, dtype=torch.long), a)
    with pytest.raises(ValueError, match="top_p must be in"):
        sample_tokens(torch.zeros(1, 3), top_p=0.0)


# ------------------------------------------------------------------------------ the three-token argument
def test_three_token_softmax_argument_and_top_p_exclusion():
    """Sampling a low-probability token with negative advantage sharpens the distribution.

    With logits x1 > x2 >> x3 and A < 0, the policy-gradient step on log p3 changes the logits by
    dx1 ∝ |A| p1, dx2 ∝ |A| p2, dx3 ∝ -|A| (p1 + p2): the leader gains the most and entropy falls.
    Under top-p the tail token is outside every kept-set, so it is never such a target.
    """
    x = torch.tensor([3.0, 2.0, -2.0], requires_grad=True)
    advantage, lr = -1.5, 0.1
    p = torch.softmax(x.detach(), dim=0)
    loss = -advantage * torch.log_softmax(x, dim=0)[2]  # policy-gradient loss for sampled token 3
    loss.backward()
    step = -lr * x.grad
    expected = lr * abs(advantage) * torch.stack([p[0], p[1], -(p[0] + p[1])])
    torch.testing.assert_close(step, expected)
    assert step[0] > step[1] > 0 > step[2]

    def entropy(logits):
        probs = torch.softmax(logits, dim=0)
        return float(-(probs * probs.log()).sum())

    updated = x.detach() + step
    assert entropy(updated) < entropy(x.detach())
    assert (updated[0] - updated[1]) > (x[0] - x[1]).detach()

    # Under top-p = 0.9 the tail token (p3 ≈ 0.005) is never sampled, and replay never touches x3.
    logits = x.detach().repeat(5000, 1)
    sample = sample_tokens(logits, top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert not bool((sample.tokens == 2).any())
    assert {tuple(sample.kept.row(i)) for i in range(5000)} == {(0, 1)}
    replay_input = x.detach().repeat(5000, 1).requires_grad_()
    (abs(advantage) * replay_logprobs(replay_input, sample.tokens, sample.kept)).sum().backward()
    assert torch.count_nonzero(replay_input.grad[:, 2]) == 0


def test_per_row_generators_make_each_row_independent_of_the_batch():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3)) * 2
    batched = sample_tokens(logits, top_p=0.9, generator=[torch.Generator().manual_seed(10 + row) for row in range(5)])
    for row in range(5):
        alone = sample_tokens(logits[row:row + 1], top_p=0.9, generator=torch.Generator().manual_seed(10 + row))
        assert int(alone.tokens[0]) == int(batched.tokens[row])
        assert alone.logprobs[0].item() == batched.logprobs[row].item()
        assert alone.kept.row(0) == batched.kept.row(row)
    with pytest.raises(ValueError, match="3 generators for 5 rows"):
        sample_tokens(logits, generator=[None] * 3)
