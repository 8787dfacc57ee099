"""From scored groups to padded training tensors, split into micro-batches by token budget.

Every :class:`relayrl.core.wire.TrajectorySegment` (one context window) becomes one training
*sequence*: the concatenation, in order, of each turn's context tokens and generated tokens, which
is exactly the token sequence the engine saw. A position holding a generated token is a *target*:
the logits one position earlier predict it, and it carries the behaviour logprob, kept-set and
policy version the engine recorded. Context positions (prompts, tool output, summaries asked for)
are never targets. All segments of a trajectory share its reward and therefore its advantage.

The layout is padded ``[S, L]`` on the right. Kept-sets of the targets are stored in CSR in
row-major target order (sequence, then position), which is the order ``mask.nonzero()`` yields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy
import torch

from relayrl.algo.sampling import KeptSets
from relayrl.core.wire import ExpertRouting, Group, Trajectory

__all__ = ["SequenceBatch", "build_sequences", "split_by_token_budget"]


@dataclasses.dataclass
class SequenceBatch:
    """Padded training sequences; ``S`` sequences of at most ``L`` tokens."""

    input_ids: torch.Tensor
    """``[S, L]`` int64 (padding 0)."""
    attention_mask: torch.Tensor
    """``[S, L]`` 1 for real tokens."""
    target_mask: torch.Tensor
    """``[S, L]`` bool: positions holding a generated (trained) token."""
    behavior_logprobs: torch.Tensor
    """``[S, L]`` float32: the engine's recorded logprob at target positions, 0 elsewhere."""
    versions: torch.Tensor
    """``[S, L]`` int64: policy version of each target token, -1 elsewhere."""
    kept: KeptSets
    """Kept-sets of the targets in row-major target order (empty rows = full vocabulary)."""
    sequence_trajectory: torch.Tensor
    """``[S]``: index into ``trajectories`` of each sequence."""
    trajectories: list[Trajectory]
    group_ids: torch.Tensor
    """``[T]``: group index of each trajectory (for advantage estimation)."""
    routing: torch.Tensor | None = None
    """``[S, L, layers, top_k]`` uint8 (int32 past 256 experts): the experts the engine routed each position to (mixture
    of experts; None when no span recorded any)."""
    routing_mask: torch.Tensor | None = None
    """``[S, L]`` bool: the positions :attr:`routing` holds a record for."""
    routing_dropped: int = 0
    """Spans whose routing record did not line up with the sequence (their positions stay unrecorded)."""

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def rewards(self) -> torch.Tensor:
        return torch.tensor([trajectory.reward for trajectory in self.trajectories], dtype=torch.float32)

    def staleness(self, trainer_version: int) -> torch.Tensor:
        """``[S]``: trainer version minus the oldest policy version of each sequence's targets."""
        versions = torch.where(self.target_mask, self.versions, torch.full_like(self.versions, 2**62))
        oldest = versions.min(dim=1).values
        return torch.where(oldest < 2**62, trainer_version - oldest, torch.zeros_like(oldest))

    def select(self, rows: Sequence[int]) -> SequenceBatch:
        """The sub-batch of sequences ``rows`` (trajectories and groups kept whole for indexing)."""
        index = torch.tensor(list(rows), dtype=torch.int64)
        counts = self.target_mask.sum(dim=1)
        starts = torch.zeros(len(counts) + 1, dtype=torch.int64)
        starts[1:] = counts.cumsum(0)
        kept_parts = []
        for row in rows:
            first, last = int(starts[row]), int(starts[row + 1])
            kept_parts.append(KeptSets(self.kept.offsets[first:last + 1], self.kept.ids))
        width = int(self.attention_mask[index].sum(dim=1).max()) if len(rows) else 0
        routing = routing_mask = None
        if self.routing is not None and self.routing_mask is not None:
            routing, routing_mask = self.routing[index, :width], self.routing_mask[index, :width]
        return SequenceBatch(
            input_ids=self.input_ids[index, :width], attention_mask=self.attention_mask[index, :width],
            target_mask=self.target_mask[index, :width], behavior_logprobs=self.behavior_logprobs[index, :width],
            versions=self.versions[index, :width], kept=KeptSets.concat(kept_parts),
            sequence_trajectory=self.sequence_trajectory[index], trajectories=self.trajectories,
            group_ids=self.group_ids, routing=routing, routing_mask=routing_mask, routing_dropped=self.routing_dropped)


def build_sequences(groups: Sequence[Group]) -> SequenceBatch:
    """Lay out every segment of every trajectory of ``groups`` as a padded training sequence."""
    trajectories: list[Trajectory] = []
    group_index: list[int] = []
    rows: list[tuple[int, list[int], list[int], list[float], list[int], list[KeptSets]]] = []
    routed: dict[int, list[ExpertRouting]] = {}  # row -> the routing records of its spans
    dropped = 0
    for g, group in enumerate(groups):
        for trajectory in group.trajectories:
            t = len(trajectories)
            trajectories.append(trajectory)
            group_index.append(g)
            for segment in trajectory.segments:
                tokens: list[int] = []
                targets: list[int] = []
                logprobs: list[float] = []
                versions: list[int] = []
                kept: list[KeptSets] = []  # each span's packed CSR, concatenated once for the whole batch
                for turn in segment.turns:
                    tokens += list(turn.context_token_ids())
                    span = turn.generated
                    if span is None or not len(span):
                        continue
                    start = len(tokens)
                    if span.routing is not None:
                        # The record counts positions from the request's prompt: it lines up with
                        # this sequence only if that prompt was exactly the tokens laid out so far.
                        if span.routing.first_generated == start:
                            routed.setdefault(len(rows), []).append(span.routing)
                        else:
                            dropped += 1
                    tokens += list(span.token_ids())
                    targets += range(start, start + len(span))
                    logprobs += list(span.token_logprobs())
                    versions += span.token_versions()
                    kept.append(KeptSets.from_packed(span.kept_offsets, span.kept_ids, len(span)))
                if targets:
                    if targets[0] == 0:
                        raise ValueError(f"trajectory {trajectory.trajectory_id}: a generated token at position 0 "
                                         "has no context to be predicted from")
                    rows.append((t, tokens, targets, logprobs, versions, kept))
    if not rows:
        raise ValueError("no generated tokens in these groups: nothing to train on")
    width = max(len(tokens) for _, tokens, *_ in rows)
    count = len(rows)
    input_ids = torch.zeros((count, width), dtype=torch.int64)
    attention = torch.zeros((count, width), dtype=torch.int64)
    target_mask = torch.zeros((count, width), dtype=torch.bool)
    behavior = torch.zeros((count, width), dtype=torch.float32)
    versions_t = torch.full((count, width), -1, dtype=torch.int64)
    kept_parts: list[KeptSets] = []
    for row, (_, tokens, targets, logprobs, versions, kept) in enumerate(rows):
        input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        attention[row, : len(tokens)] = 1
        index = torch.tensor(targets, dtype=torch.int64)
        target_mask[row, index] = True
        behavior[row, index] = torch.tensor(logprobs, dtype=torch.float32)
        versions_t[row, index] = torch.tensor(versions, dtype=torch.int64)
        kept_parts += kept
    routing, routing_mask = _routing_tensors(routed, count, width)
    return SequenceBatch(input_ids=input_ids, attention_mask=attention, target_mask=target_mask,
                         behavior_logprobs=behavior, versions=versions_t, kept=KeptSets.concat(kept_parts),
                         sequence_trajectory=torch.tensor([row[0] for row in rows], dtype=torch.int64),
                         trajectories=trajectories, group_ids=torch.tensor(group_index, dtype=torch.int64),
                         routing=routing, routing_mask=routing_mask, routing_dropped=dropped)


def _routing_tensors(routed: dict[int, list[ExpertRouting]], count: int,
                     width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``[S, L, layers, top_k]`` expert ids and their ``[S, L]`` mask from each row's records."""
    records = [record for row_records in routed.values() for record in row_records]
    if not records:
        return None, None
    layout = {(record.layers, record.top_k, record.width) for record in records}
    if len(layout) > 1:
        raise ValueError(f"routing records of different layouts (layers, top-k, width) in one batch: {sorted(layout)}")
    layers, top_k, item = layout.pop()
    dtype = numpy.dtype("u1") if item == 1 else numpy.dtype("<u2")
    routing = torch.zeros((count, width, layers, top_k), dtype=torch.uint8 if item == 1 else torch.int32)
    mask = torch.zeros((count, width), dtype=torch.bool)
    for row, row_records in routed.items():
        for record in row_records:
            end = min(record.end, width)
            if end <= record.start:
                continue
            experts = numpy.frombuffer(record.experts, dtype=dtype).reshape(len(record), layers, top_k)
            routing[row, record.start:end] = torch.from_numpy(experts[: end - record.start].astype(
                numpy.uint8 if item == 1 else numpy.int32))
            mask[row, record.start:end] = True
    return routing, mask


def split_by_token_budget(batch: SequenceBatch, max_tokens: int) -> list[tuple[torch.Tensor, SequenceBatch]]:
    """Micro-batches of whole sequences whose padded size (rows x longest) stays within ``max_tokens``.

    Returns ``(rows, micro_batch)`` pairs, ``rows`` indexing the sequences of ``batch``.

    Sequences are sorted by length so that similar lengths share a micro-batch (less padding); a
    sequence longer than the budget gets a micro-batch of its own.
    """
    lengths = batch.attention_mask.sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lambda row: lengths[row])
    parts: list[list[int]] = []
    current: list[int] = []
    for row in order:
        longest = max([lengths[r] for r in current] + [lengths[row]])
        if current and longest * (len(current) + 1) > max_tokens:
            parts.append(current)
            current = []
        current.append(row)
    if current:
        parts.append(current)
    return [(torch.tensor(sorted(part), dtype=torch.int64), batch.select(sorted(part))) for part in parts]
