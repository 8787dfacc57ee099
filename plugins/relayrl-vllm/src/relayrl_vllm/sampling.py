"""Kept-set capture inside vLLM: two ways, one result.

relayrl needs, for every sampled token, its logprob under the truncated distribution it was drawn
from and that distribution's support (the kept-set). vLLM offers two routes:

``sampling-mask`` (vLLM's own *sampling distribution replay*, Model Runner V2, GPU)
    vLLM truncates with its own top-k/top-p kernels and returns each token's support
    (``CompletionOutput.sampling_mask``); ``logprobs_mode="processed_logprobs"`` makes the returned
    logprob the one renormalised over that support.

``logits-processor`` (any vLLM with class-based logits processors; the CPU build)
    :class:`KeptSetTruncation` applies relayrl's own rule (:func:`relayrl.algo.truncate_logits`:
    temperature, top-k, top-p, ``max_kept``) and sets every logit outside the kept-set to ``-inf``;
    vLLM then samples at temperature 1 with no truncation of its own, so it draws from exactly the
    renormalised kept distribution, and its processed logprobs are relayrl's logprobs. The kept-set
    comes back as the tokens with a finite processed logprob among the top ``K`` returned, where
    ``K`` bounds the kept-set size (``top_k``, ``max_kept``, else the vocabulary: set ``max_kept``
    on large vocabularies, or every token carries a vocabulary-sized logprob row).

Either way the engine reports what vLLM actually sampled from, so the trainer's replay is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from relayrl.rollout.protocol import SamplingParams

__all__ = ["KeptSetTruncation", "kept_bound", "relayrl_args", "tokens_from_completion"]

EXTRA_ARGS_KEY = "relayrl_sampling"
"""Key of ``vllm.SamplingParams.extra_args`` that carries relayrl's truncation to the processor."""


def relayrl_args(params: SamplingParams) -> dict[str, Any]:
    """The truncation the processor applies for one request (travels in ``extra_args``)."""
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "max_kept": params.max_kept}


def truncates(params: SamplingParams) -> bool:
    """Whether a request's distribution is truncated at all (else its kept-sets are the full vocabulary)."""
    return params.temperature == 0 or params.top_p < 1.0 or params.top_k > 0 or params.max_kept > 0


def kept_bound(params: SamplingParams, vocab_size: int) -> int:
    """The largest kept-set a request can have: how many logprobs to ask vLLM for."""
    if params.temperature == 0:
        return 1
    return min(vocab_size, params.top_k or vocab_size, params.max_kept or vocab_size)


class _LogitsProcessorBase:  # replaced by vLLM's ABC when vLLM is importable (see below)
    pass


try:  # the processor class must subclass vLLM's; this module is also imported where vLLM is absent
    from vllm.v1.sample.logits_processor import LogitsProcessor as _LogitsProcessorBase  # type: ignore[no-redef]
    from vllm.v1.sample.logits_processor import MoveDirectionality
except ImportError:  # pragma: no cover - exercised only without vLLM
    MoveDirectionality = None


class KeptSetTruncation(_LogitsProcessorBase):
    """vLLM v1 logits processor applying relayrl's truncation to the requests that ask for it.

    Requests carry their truncation in ``extra_args["relayrl_sampling"]``; others pass untouched.
    Rows with the same parameters are truncated in one call. Not argmax-invariant (it rescales by
    temperature), so vLLM applies it before any sampling, greedy included.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[float, float, int, int]] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        args = (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if args is None:
            return
        if not (args["temperature"] >= 0 and 0 < args["top_p"] <= 1 and args["top_k"] >= 0 and args["max_kept"] >= 0):
            raise ValueError(f"invalid relayrl sampling arguments: {args}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, _output in batch_update.added:
            args = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
            if args is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (float(args["temperature"]), float(args["top_p"]), int(args["top_k"]),
                                    int(args["max_kept"]))
        for source, target, direction in batch_update.moved:
            moving = self.rows.pop(source, None)
            displaced = self.rows.pop(target, None)
            if moving is not None:
                self.rows[target] = moving
            if direction == MoveDirectionality.SWAP and displaced is not None:
                self.rows[source] = displaced

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        from relayrl.algo.sampling import truncate_logits

        groups: dict[tuple[float, float, int, int], list[int]] = {}
        for index, key in self.rows.items():
            if index < logits.shape[0]:
                groups.setdefault(key, []).append(index)
        for (temperature, top_p, top_k, max_kept), indices in groups.items():
            rows = torch.tensor(indices, device=logits.device)
            truncated = truncate_logits(logits[rows], temperature=temperature, top_p=top_p, top_k=top_k,
                                        max_kept=max_kept or None)
            logits[rows] = truncated.to(logits.dtype)
        return logits


def tokens_from_completion(token_ids: Sequence[int], logprobs: Sequence[Any] | None, sampling_mask: Any,
                           params: SamplingParams, vocab_size: int) -> tuple[list[float], list[list[int]]]:
    """Per-token logprobs and kept-sets of the new tokens of one vLLM ``CompletionOutput`` delta.

    ``logprobs``: vLLM's per-position ``{token_id: Logprob}`` (processed logprobs);
    ``sampling_mask``: vLLM's ``SamplingMask`` for the same positions, or None (capture route).
    A kept-set covering the whole vocabulary is stored as ``[]`` (the wire convention).
    """
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned {0 if logprobs is None else len(logprobs)} logprob rows for "
                           f"{len(token_ids)} tokens: was the request sent with logprobs?")
    masks = sampling_mask.token_ids if sampling_mask is not None else None
    if masks is not None and len(masks) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(masks)} sampling masks for {len(token_ids)} tokens")
    values: list[float] = []
    kept_sets: list[list[int]] = []
    for position, token in enumerate(token_ids):
        row = logprobs[position]
        if params.temperature == 0:  # greedy: the argmax alone, probability 1
            values.append(0.0)
            kept_sets.append([int(token)])
            continue
        values.append(float(row[token].logprob))
        if masks is not None:
            kept = sorted(int(t) for t in masks[position])
        elif truncates(params):
            kept = sorted(int(t) for t, entry in row.items() if math.isfinite(entry.logprob))
        else:
            kept = []
        if len(kept) >= vocab_size:
            kept = []
        if kept and int(token) not in kept:
            raise RuntimeError(f"vLLM sampled token {token} outside its own kept-set {kept[:8]}...")
        kept_sets.append(kept)
    return values, kept_sets
