"""relayrl-vllm's conversion of vLLM's routed experts, checked against the torch engine's record.

vLLM returns a finished request's routing as ``[positions, layers, top_k]`` for the positions from
``routed_experts_prompt_start`` to the last token fed back. These tests need no vLLM: the rows are
the torch engine's own record of the same request, laid out as vLLM lays them out, so a correct
conversion reproduces the torch engine's record byte for byte.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import GenerateRequest, SamplingParams
from relayrl.rollout.testing import tiny_moe
from relayrl_vllm.routing import expert_count, routing_record


def _torch_engine_span(prompt: list[int], routing_from: int, max_tokens: int = 7):
    engine = TorchEngine(tiny_moe(seed=0), engine_id="torch-moe-reference")
    try:
        request = GenerateRequest(request_id="r", prompt=prompt,
                                  params=SamplingParams(max_tokens=max_tokens, seed=3, routing_from=routing_from))
        return asyncio.run(engine.generate(request))
    finally:
        asyncio.run(engine.close())


def _rows(record) -> np.ndarray:
    """A record's expert ids in vLLM's ``routed_experts`` layout."""
    dtype = np.uint8 if record.width == 1 else np.dtype("<u2")
    return np.frombuffer(record.experts, dtype=dtype).reshape(len(record), record.layers, record.top_k)


@pytest.mark.parametrize("routing_from", [0, 3])
def test_vllm_rows_convert_to_the_torch_engines_record(routing_from) -> None:
    prompt = [1, 5, 9, 13, 17]
    span = _torch_engine_span(prompt, routing_from)
    theirs = span.routing
    ours = routing_record(_rows(theirs).copy(), routing_from=routing_from, prompt_length=len(prompt),
                          generated=len(span), experts=expert_count(tiny_moe().config))
    assert ours == theirs


def test_rows_that_do_not_match_the_request_are_dropped() -> None:
    prompt = [1, 5, 9, 13, 17]
    span = _torch_engine_span(prompt, 0)
    rows = _rows(span.routing)
    convert = lambda array, **kw: routing_record(array, **{"routing_from": 0, "prompt_length": len(prompt),  # noqa: E731
                                                           "generated": len(span), "experts": 8, **kw})
    assert convert(rows) is not None
    assert convert(rows[1:]) is None  # a position short (e.g. vLLM recomputed after a preemption)
    assert convert(np.concatenate([rows, rows[:1]])) is None  # one too many (the last token included)
    assert convert(rows, routing_from=1) is None  # the request asked for fewer positions
    assert convert(rows[:, :1]) is not None  # the layer count is vLLM's to say...
    assert convert(rows, experts=2) is None  # ...but an id the model does not have is not
    assert convert(rows.reshape(len(rows), -1)) is None
    assert convert(None) is None


def test_more_than_256_experts_pack_two_bytes_little_endian() -> None:
    rows = np.array([[[300, 2]], [[7, 511]]], dtype=np.uint16)
    record = routing_record(rows, routing_from=0, prompt_length=2, generated=1, experts=512)
    assert (record.width, record.layers, record.top_k, len(record)) == (2, 1, 2, 2)
    assert record.experts == rows.astype("<u2").tobytes()


def test_expert_counts_from_the_configs_of_the_common_moe_families() -> None:
    from types import SimpleNamespace

    assert expert_count(tiny_moe().config) == 8  # Qwen2/3-MoE, OLMoE: num_experts
    assert expert_count(SimpleNamespace(num_local_experts=4)) == 4  # Mixtral
    assert expert_count(SimpleNamespace(n_routed_experts=64)) == 64  # DeepSeek
    assert expert_count(SimpleNamespace(num_experts=None, hidden_size=8)) == 0  # dense
