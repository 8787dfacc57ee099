"""Sampling with kept-set capture (rollout side) and its exact replay (trainer side).

This pair is the entropy-preservation mechanism of the SWE-1.7 report. At rollout time the
sampler truncates the distribution (temperature, then top-k, then top-p over the renormalised
top-k distribution, then an optional cap ``max_kept``), samples from the renormalised truncated
distribution, and records for every token

* its logprob under exactly that truncated distribution, and
* its *kept-set*: the token ids it could have been sampled from, in CSR form.

The trainer recomputes each token's logprob *renormalised over the same kept-set*
(:func:`replay_logprobs`), so trainer and sampler compute the same quantity and the importance
ratio between them measures only numerical mismatch, not the truncation. Two consequences:

* tokens outside the kept-set (the low-probability tail) are never optimisation targets, so a
  negative advantage can never sharpen the distribution through them (see ``docs/algorithms.md``);
* a token whose kept-set has size one has renormalised probability 1: its logprob is exactly 0
  and its gradient exactly 0, so confident tokens drop out of the gradient.

**The cap.** ``max_kept`` bounds a kept-set's size (memory on the wire and in the trainer). When it
binds, the sampler samples from the ``max_kept`` most likely tokens, renormalised, and records
exactly that set, so replay stays exact; what changes is the behaviour policy itself. Its
distance from the intended top-p distribution is bounded per row by
``TV(intended, actual) = 1 - P(kept) / P(intended set) <= 1 - P(kept)``, where ``P`` is the
(top-k renormalised) model distribution; :class:`SampleResult` reports that bound per row
(``cap_bias_bound``, 0 where the cap did not bind).

**The wire convention.** An empty kept-set row means "not truncated": the full vocabulary (plain
sampling). Replay then normalises over the full vocabulary for that row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from relayrl.core.arrays import unpack_u32

__all__ = ["KeptSets", "SampleResult", "full_entropy", "replay_logprobs", "sample_tokens", "truncate_logits"]


@dataclasses.dataclass(frozen=True)
class KeptSets:
    """Kept-sets of ``rows`` tokens in CSR form: ids of row ``i`` are ``ids[offsets[i]:offsets[i+1]]``.

    An empty row means the full vocabulary. Both tensors are int64 on the same device.
    """

    offsets: torch.Tensor
    ids: torch.Tensor

    def __post_init__(self) -> None:
        if self.offsets.dim() != 1 or self.ids.dim() != 1 or self.offsets.numel() < 1:
            raise ValueError("KeptSets: offsets and ids must be 1-D, offsets non-empty")

    @property
    def rows(self) -> int:
        return self.offsets.numel() - 1

    def counts(self) -> torch.Tensor:
        """Size of each row's kept-set (0 = full vocabulary)."""
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, index: int) -> list[int]:
        return self.ids[self.offsets[index]:self.offsets[index + 1]].tolist()

    def to(self, device: torch.device | str) -> KeptSets:
        return KeptSets(self.offsets.to(device), self.ids.to(device))

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], device: torch.device | str | None = None) -> KeptSets:
        """Build from one sequence of ids per row (``[]`` = full vocabulary)."""
        counts = torch.tensor([len(row) for row in rows], dtype=torch.int64)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = counts.cumsum(0)
        ids = torch.tensor([token for row in rows for token in row], dtype=torch.int64)
        return cls(offsets.to(device), ids.to(device))

    @classmethod
    def from_packed(cls, offsets: bytes, ids: bytes, rows: int) -> KeptSets:
        """From a span's packed uint32 CSR (``GeneratedSpan.kept_offsets`` / ``kept_ids``), one copy
        each; empty ``offsets`` (a span without kept-sets) means ``rows`` rows of full vocabulary."""
        if not offsets:
            return cls(torch.zeros(rows + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        return cls(_u32_tensor(offsets), _u32_tensor(ids))

    @classmethod
    def concat(cls, parts: Sequence[KeptSets]) -> KeptSets:
        """Stack kept-sets of consecutive row blocks into one."""
        if not parts:
            return cls(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        # Parts may be views into a larger CSR (offsets not starting at 0): rebase each.
        offsets = [torch.zeros(1, dtype=torch.int64, device=parts[0].offsets.device)]
        ids, base = [], 0
        for part in parts:
            offsets.append(part.offsets[1:] - part.offsets[0] + base)
            ids.append(part.ids[part.offsets[0]:part.offsets[-1]])
            base += int(part.offsets[-1] - part.offsets[0])
        return cls(torch.cat(offsets), torch.cat(ids))


def _u32_tensor(packed: bytes) -> torch.Tensor:
    """Little-endian uint32 bytes as an int64 tensor (uint32 first: an id >= 2**31 stays positive)."""
    if not packed:
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(unpack_u32(packed), dtype=torch.uint32).to(torch.int64)


@dataclasses.dataclass(frozen=True)
class SampleResult:
    """What :func:`sample_tokens` returns for ``rows`` rows."""

    tokens: torch.Tensor
    """Sampled token ids, int64 ``[rows]``."""
    logprobs: torch.Tensor
    """Logprob of each token under the truncated, renormalised distribution, float32 ``[rows]``."""
    kept: KeptSets
    """Kept-set of every row (empty row = full vocabulary)."""
    kept_mass: torch.Tensor
    """Probability mass of the kept-set under the top-k-renormalised model distribution, ``[rows]``."""
    cap_bias_bound: torch.Tensor
    """Upper bound on TV(intended top-p distribution, sampled one) due to ``max_kept``; 0 if uncapped."""


def _validate(temperature: float, top_p: float, top_k: int, max_kept: int | None) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if max_kept is not None and max_kept < 1:
        raise ValueError(f"max_kept must be >= 1 or None, got {max_kept}")


@dataclasses.dataclass(frozen=True)
class _Truncation:
    """The kept-set rule applied to ``[rows, vocab]`` logits (see :func:`sample_tokens`)."""

    cand_logits: torch.Tensor
    """Temperature-scaled logits of the candidates, most likely first, ``[rows, candidates]``."""
    cand_ids: torch.Tensor
    probs: torch.Tensor
    """Candidate probabilities under the top-k renormalised distribution."""
    counts: torch.Tensor
    """Kept-set size per row: the kept-set is the first ``counts[row]`` candidates."""
    kept_mass: torch.Tensor
    cap_binds: torch.Tensor
    candidates: int


def _truncate(logits: torch.Tensor, *, temperature: float, top_p: float, top_k: int,
              max_kept: int | None) -> _Truncation:
    rows, vocab = logits.shape
    device = logits.device
    scaled = logits.float() / temperature
    k_limit = min(top_k, vocab) if top_k else vocab
    candidates = min(k_limit, max_kept) if max_kept else k_limit
    if candidates < vocab:
        cand_logits, cand_ids = torch.topk(scaled, candidates, dim=-1)
    else:
        cand_logits, cand_ids = torch.sort(scaled, dim=-1, descending=True)
    # Normaliser of the distribution top-p is measured on: the top-k set, or the whole vocabulary.
    if k_limit < vocab:
        top_k_logits = cand_logits if candidates == k_limit else torch.topk(scaled, k_limit, dim=-1).values
        normaliser = torch.logsumexp(top_k_logits, dim=-1, keepdim=True)
    else:
        normaliser = torch.logsumexp(scaled, dim=-1, keepdim=True)
    probs = (cand_logits - normaliser).exp()

    cumulative = probs.cumsum(dim=-1)
    if top_p < 1.0:
        # Keep token i while the mass strictly before it is below top_p: a prefix by construction.
        counts = ((cumulative - probs) < top_p).sum(dim=-1)
    else:
        counts = torch.full((rows,), candidates, dtype=torch.int64, device=device)
    counts = counts.clamp(min=1)
    kept_mass = cumulative.gather(1, (counts - 1).unsqueeze(1)).squeeze(1).clamp(max=1.0)

    cap_binds = torch.zeros(rows, dtype=torch.bool, device=device)
    if max_kept is not None and max_kept < k_limit:
        reached = kept_mass >= top_p if top_p < 1.0 else torch.zeros_like(cap_binds)
        cap_binds = (counts == candidates) & ~reached
    return _Truncation(cand_logits, cand_ids, probs, counts, kept_mass, cap_binds, candidates)


@torch.no_grad()
def truncate_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                    max_kept: int | None = None) -> torch.Tensor:
    """Temperature-scaled logits with ``-inf`` outside each row's kept-set, float32 ``[rows, vocab]``.

    The kept-set is exactly :func:`sample_tokens`' (same rule, same ties), so sampling from
    ``softmax(truncate_logits(...))`` is sampling from the same truncated, renormalised
    distribution, and ``log_softmax`` of the result gives the same logprobs. Inference engines that
    sample with their own kernels (the vLLM plugin's logits processor) truncate with this, then
    sample at temperature 1 with no further truncation. ``temperature=0`` keeps only the argmax.
    """
    _validate(temperature, top_p, top_k, max_kept)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    masked = torch.full(logits.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    if temperature == 0:
        return masked.scatter_(1, logits.argmax(dim=-1, keepdim=True), 0.0)
    truncation = _truncate(logits, temperature=temperature, top_p=top_p, top_k=top_k, max_kept=max_kept)
    in_kept = torch.arange(truncation.candidates, device=logits.device).unsqueeze(0) < truncation.counts.unsqueeze(1)
    kept_logits = truncation.cand_logits.masked_fill(~in_kept, float("-inf"))
    return masked.scatter_(1, truncation.cand_ids, kept_logits)


@torch.no_grad()
def sample_tokens(logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                  max_kept: int | None = None,
                  generator: torch.Generator | Sequence[torch.Generator | None] | None = None) -> SampleResult:
    """Sample one token per row of ``logits`` ``[rows, vocab]`` and record its kept-set.

    Order of truncation: temperature scaling, then top-k (``0`` = off), then top-p over the
    renormalised top-k distribution (the smallest prefix, by probability, whose mass reaches
    ``top_p``; the most likely token is always kept), then ``max_kept``. ``temperature=0`` is greedy:
    every kept-set is the argmax alone, so every logprob is 0.

    Cost: with ``top_k`` or ``max_kept`` set, a partial ``topk`` over the vocabulary; otherwise a
    full sort per row (set ``max_kept`` on large vocabularies).

    ``generator`` is one generator for the whole batch, or one per row (``None`` entries use the
    global generator): with per-row generators a row's token depends only on its logits and its
    generator, never on the other rows of the batch (the engine's per-request seeds rely on it).
    """
    _validate(temperature, top_p, top_k, max_kept)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    rows, vocab = logits.shape
    device = logits.device
    if temperature == 0:
        tokens = logits.argmax(dim=-1)  # greedy: no generator is used
        zeros = torch.zeros(rows, dtype=torch.float32, device=device)
        offsets = torch.arange(rows + 1, dtype=torch.int64, device=device)
        return SampleResult(tokens, zeros, KeptSets(offsets, tokens.clone()), torch.ones_like(zeros), zeros)

    truncation = _truncate(logits, temperature=temperature, top_p=top_p, top_k=top_k, max_kept=max_kept)
    cand_logits, cand_ids, probs = truncation.cand_logits, truncation.cand_ids, truncation.probs
    counts, kept_mass, candidates = truncation.counts, truncation.kept_mass, truncation.candidates
    cap_bias_bound = torch.where(truncation.cap_binds, 1.0 - kept_mass, torch.zeros_like(kept_mass))

    positions = torch.arange(candidates, device=device)
    in_kept = positions.unsqueeze(0) < counts.unsqueeze(1)
    weights = probs * in_kept
    if isinstance(generator, Sequence):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} generators for {rows} rows")
        choice = torch.cat([torch.multinomial(weights[row:row + 1], 1, generator=generator[row])
                            for row in range(rows)])
    else:
        choice = torch.multinomial(weights, 1, generator=generator)
    tokens = cand_ids.gather(1, choice).squeeze(1)
    kept_logits = cand_logits.masked_fill(~in_kept, float("-inf"))
    logprobs = cand_logits.gather(1, choice).squeeze(1) - torch.logsumexp(kept_logits, dim=-1)

    # A kept-set that is the whole vocabulary is stored as an empty row (the wire convention).
    full = counts == vocab
    stored = torch.where(full, torch.zeros_like(counts), counts)
    offsets = torch.zeros(rows + 1, dtype=torch.int64, device=device)
    offsets[1:] = stored.cumsum(0)
    ids = cand_ids[in_kept & ~full.unsqueeze(1)]
    return SampleResult(tokens, logprobs, KeptSets(offsets, ids), kept_mass, cap_bias_bound)


def replay_logprobs(logits: torch.Tensor, tokens: torch.Tensor, kept: KeptSets, *, temperature: float = 1.0,
                    return_kept_entropy: bool = False, full_rows_chunk: int = 1024
                    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each ``tokens[i]`` under ``softmax(logits[i] / temperature)`` renormalised over its kept-set.

    Differentiable with respect to ``logits`` ``[rows, vocab]`` (any float dtype; computed in
    float32). Memory: no ``rows x vocab`` mask or copy is built. The kept logits are gathered
    (``nnz`` values) and reduced per segment with a detached per-row maximum; rows whose kept-set
    is empty (full vocabulary) are reduced with ``logsumexp`` over ``full_rows_chunk`` rows at a
    time. A kept-set of size one gives logprob exactly 0 and gradient exactly 0.

    With ``return_kept_entropy`` also returns the entropy of each row's renormalised kept-set
    distribution (0 for singletons), detached, from the same gathered values.
    """
    if logits.dim() != 2 or tokens.dim() != 1 or tokens.numel() != logits.shape[0] or kept.rows != logits.shape[0]:
        raise ValueError(f"shapes disagree: logits {tuple(logits.shape)}, tokens {tuple(tokens.shape)}, "
                         f"kept-sets for {kept.rows} rows")
    if not temperature > 0:
        raise ValueError(f"replay needs temperature > 0, got {temperature} (greedy tokens are singletons: use 1.0)")
    rows = logits.shape[0]
    device = logits.device
    counts = kept.counts()
    truncated = counts > 0
    # One gather for the kept logits and the sampled tokens' logits: its backward is a single
    # scatter into the gradient of ``logits``.
    row_index = torch.repeat_interleave(torch.arange(rows, device=device), counts)
    gathered = logits[torch.cat([row_index, torch.arange(rows, device=device)]),
                      torch.cat([kept.ids, tokens])].float() / temperature
    kept_logits, token_logits = gathered[:row_index.numel()], gathered[row_index.numel():]

    # Segment log-sum-exp over the kept logits, shifted by a detached per-row maximum.
    neg_inf = torch.full((rows,), float("-inf"), device=device)
    segment_max = neg_inf.scatter_reduce(0, row_index, kept_logits.detach(), reduce="amax", include_self=True)
    segment_max = torch.where(truncated, segment_max, torch.zeros_like(segment_max))
    shifted = (kept_logits - segment_max[row_index]).exp()
    segment_sum = torch.zeros(rows, device=device).index_add(0, row_index, shifted)
    # Guard empty rows so that log(0) never enters the graph (0 * inf would poison gradients).
    segment_sum = torch.where(truncated, segment_sum, torch.ones_like(segment_sum))
    log_normaliser = segment_max + segment_sum.log()

    full_rows = (~truncated).nonzero().squeeze(1)
    if full_rows.numel():
        parts = [torch.logsumexp(logits[chunk].float() / temperature, dim=-1)
                 for chunk in full_rows.split(full_rows_chunk)]
        full_normaliser = torch.zeros(rows, device=device).index_copy(0, full_rows, torch.cat(parts))
        log_normaliser = torch.where(truncated, log_normaliser, full_normaliser)

    logprobs = token_logits - log_normaliser
    logprobs = torch.where(counts == 1, torch.zeros_like(logprobs), logprobs)
    if not return_kept_entropy:
        return logprobs
    with torch.no_grad():
        weights = shifted.detach() / segment_sum.detach()[row_index]
        weighted = torch.zeros(rows, device=device).index_add(0, row_index, weights * kept_logits.detach())
        entropy = torch.where(counts > 1, log_normaliser.detach() - weighted, torch.zeros_like(weighted))
    return logprobs, entropy


@torch.no_grad()
def full_entropy(logits: torch.Tensor, *, temperature: float = 1.0, chunk_rows: int = 1024) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per row, computed ``chunk_rows`` rows at a time."""
    parts = []
    for chunk in logits.split(chunk_rows):
        scaled = chunk.float() if temperature == 1.0 else chunk.float() / temperature
        # H = logsumexp(z) - sum(softmax(z) * z): two passes over the row and one temporary, where
        # log_softmax, exp and a product would make three.
        normaliser = torch.logsumexp(scaled, dim=-1)
        probs = (scaled - normaliser.unsqueeze(-1)).exp_()
        parts.append(normaliser - torch.linalg.vecdot(probs, scaled))
    return torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)
