"""What the buffer hands the trainer: a batch of complete groups, its drops, metrics and cursor."""

from __future__ import annotations

import dataclasses

from relayrl.buffer.cursor import BufferState
from relayrl.buffer.segments import GroupRef
from relayrl.core import wire


@dataclasses.dataclass(frozen=True)
class BatchGroup:
    """One admitted group of a batch."""

    ref: GroupRef
    group: wire.Group
    weight: float
    """Loss weight multiplier from admission (1.0 unless down-weighted)."""
    staleness: int
    tokens: int
    weight_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class DroppedGroup:
    """A group resolved without training, and why (``stale``, ``zero_variance`` ...)."""

    ref: GroupRef
    group_id: str
    reason: str


@dataclasses.dataclass(frozen=True)
class BatchMetrics:
    """Per-batch numbers for the trainer's logs."""

    groups: int
    trajectories: int
    tokens: int
    generated_tokens: int
    staleness: dict[int, int]
    """Histogram: staleness -> admitted groups."""
    dropped: dict[str, int]
    """Reason -> groups dropped while forming this batch."""
    down_weighted: dict[str, int]
    """Reason -> admitted groups with weight < 1."""
    ingest_lag_s_mean: float
    """Mean seconds from commit (producer clock) to ingest (buffer clock); clock skew shows here."""
    ingest_lag_s_max: float
    pending: int
    """Groups still waiting after this batch."""
    rebalanced: bool
    """Drawn by the restart policy in the running mix."""
    rebalance_shortfall: int
    """Places the mix owed to strata that had too few groups (filled from others)."""
    oversized_groups: int
    """Groups larger than the token budget, batched alone."""

    def as_dict(self, prefix: str = "buffer/") -> dict[str, float]:
        """Flat ``name -> number`` for metric loggers."""
        out: dict[str, float] = {
            f"{prefix}groups": self.groups, f"{prefix}trajectories": self.trajectories,
            f"{prefix}tokens": self.tokens, f"{prefix}generated_tokens": self.generated_tokens,
            f"{prefix}ingest_lag_s_mean": self.ingest_lag_s_mean, f"{prefix}ingest_lag_s_max": self.ingest_lag_s_max,
            f"{prefix}pending": self.pending, f"{prefix}rebalanced": float(self.rebalanced),
            f"{prefix}rebalance_shortfall": self.rebalance_shortfall, f"{prefix}oversized_groups": self.oversized_groups,
        }
        out.update({f"{prefix}staleness/{key}": count for key, count in sorted(self.staleness.items())})
        out.update({f"{prefix}dropped/{key}": count for key, count in sorted(self.dropped.items())})
        out.update({f"{prefix}down_weighted/{key}": count for key, count in sorted(self.down_weighted.items())})
        return out


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch of complete groups in commit order.

    ``state`` is the buffer cursor *after* this batch: store it in the same checkpoint as the
    trainer step that consumes the batch, and restore it with that step.
    """

    index: int
    """0-based number of this batch in the run."""
    trainer_version: int
    groups: tuple[BatchGroup, ...]
    dropped: tuple[DroppedGroup, ...]
    metrics: BatchMetrics
    state: BufferState

    def __len__(self) -> int:
        return len(self.groups)
