"""The trainer side: ingest committed segments, admit groups, hand out exactly-once batches.

Example::

    buffer = Buffer(open_store("s3://bus/run"), config.buffer)
    if checkpoint is not None:
        buffer.restore(checkpoint["buffer"])
    while training:
        batch = buffer.wait_for_batch(trainer_version)
        step(batch.groups)                                   # weights change
        save_checkpoint(model, optimizer, buffer=batch.state)  # one atomic checkpoint
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from relayrl.buffer.admission import Admission, AdmissionChain, build_admission
from relayrl.buffer.batch import Batch, BatchGroup, BatchMetrics, DroppedGroup
from relayrl.buffer.config import BufferSection
from relayrl.buffer.cursor import BufferState, Cursor
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.restart import shortfall, stratified_order, stratum_of, update_mix
from relayrl.buffer.segments import GroupRef, parse_segment_key
from relayrl.core import codec, wire
from relayrl.core.errors import WireError
from relayrl.core.plugins import PluginManager
from relayrl.core.store import Store


class Buffer:
    """Rollout buffer of one trainer: polls ``store`` for segments and forms batches of complete groups.

    Not thread-safe: one trainer process (rank 0) owns it. Batches are a deterministic function of
    the committed segments the buffer has seen, its state, and the trainer versions passed in:
    pending groups are kept in commit order (segment ``created_at``, producer, sequence, index),
    which does not depend on when polls happened.
    """

    def __init__(self, store: Store, config: BufferSection | None = None, *, admission: AdmissionChain | None = None,
                 pm: PluginManager | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config or BufferSection()
        self.prefix = self.config.prefix.strip("/")
        self.admission = admission if admission is not None else build_admission(self.config, pm)
        self._clock = clock
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._reset(BufferState())

    def _reset(self, state: BufferState) -> None:
        self._cursor = Cursor.from_state(state)
        self._batches = state.batches
        self._mix = dict(state.mix)
        self._pending: list[PendingGroup] = []
        self._seen: set[tuple[str, int]] = set()
        self._segment_sizes: dict[tuple[str, int], int] = {}
        self._rebalance_left = 0

    # --------------------------------------------------------------------------- state
    def state(self) -> BufferState:
        """The cursor after the last batch handed out (equal to that batch's ``state``)."""
        return BufferState(batches=self._batches, resolved_groups=self._cursor.resolved_groups,
                           producers=self._cursor.to_states(), mix=dict(self._mix))

    def restore(self, state: BufferState | dict[str, Any] | bytes, *, rebalance: bool = True) -> None:
        """Continue from ``state`` (a checkpointed :meth:`state` or ``Batch.state``).

        Pending groups are forgotten and re-ingested from the store on the next poll, except those
        the state marks resolved. With ``rebalance`` (and a non-empty running mix) the next
        ``buffer.restart.rebalance_batches`` batches are drawn in the running mix.
        """
        self._reset(BufferState.coerce(state))
        if rebalance and self._mix:
            self._rebalance_left = self.config.restart.rebalance_batches

    @property
    def pending(self) -> int:
        """Groups ingested and not yet resolved."""
        return len(self._pending)

    @property
    def pending_tokens(self) -> int:
        """Tokens (context + generated) of the groups ingested and not yet resolved."""
        return sum(group.tokens for group in self._pending)

    @property
    def rebalancing(self) -> bool:
        """Whether the next batch is drawn by the restart policy."""
        return self._rebalance_left > 0

    # --------------------------------------------------------------------------- ingest
    def poll(self) -> int:
        """Ingest segments committed since the last poll; return how many groups were added.

        Segments whose groups are all resolved are not downloaded. While ``max_pending_groups``
        groups wait, the rest stay in the store for later polls. A corrupt or mislabelled segment
        raises (StoreError / WireError naming its key) rather than being skipped: skipping would
        silently lose its groups.
        """
        fresh: list[tuple[str, str, int]] = []
        for key in self.store.list(f"{self.prefix}/"):
            parsed = parse_segment_key(self.prefix, key)
            if parsed is None or parsed in self._seen:
                continue
            if self._cursor.segment_done(*parsed):
                self._seen.add(parsed)
                continue
            fresh.append((key, *parsed))
        # Lowest sequence numbers first, interleaving producers, so that a bounded ingest keeps
        # every producer moving.
        fresh.sort(key=lambda item: (item[2], item[1]))
        added = 0
        chunk = self.config.ingest_threads
        for start in range(0, len(fresh), chunk):
            if len(self._pending) >= self.config.max_pending_groups:
                break
            for (key, producer_id, sequence), segment in zip(fresh[start:start + chunk],
                                                             self._fetch(fresh[start:start + chunk])):
                added += self._admit_segment(key, producer_id, sequence, segment)
        return added

    def _fetch(self, items: list[tuple[str, str, int]]) -> Iterator[wire.RolloutSegment]:
        if len(items) == 1 or self.config.ingest_threads == 1:
            return (self._fetch_one(key) for key, _, _ in items)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.config.ingest_threads,
                                                               thread_name_prefix="relayrl-buffer-ingest")
        return self._pool.map(self._fetch_one, [key for key, _, _ in items])

    def _fetch_one(self, key: str) -> wire.RolloutSegment:
        return codec.decode_compressed(self.store.get_buffer(key), wire.RolloutSegment, what=f"{self.store.url}/{key}")

    def _admit_segment(self, key: str, producer_id: str, sequence: int, segment: wire.RolloutSegment) -> int:
        if segment.producer_id != producer_id or segment.sequence != sequence:
            raise WireError(f"{self.store.url}/{key}: segment says producer {segment.producer_id!r} sequence "
                            f"{segment.sequence}, its name says {producer_id!r} {sequence}")
        self._seen.add((producer_id, sequence))
        self._segment_sizes[(producer_id, sequence)] = len(segment.groups)
        if not segment.groups:
            self._cursor.complete_segment(producer_id, sequence)
            return 0
        now = self._clock()
        fresh = [PendingGroup.from_group(ref, group, committed_at=segment.created_at, ingested_at=now)
                 for index, group in enumerate(segment.groups)
                 if not self._cursor.is_resolved(ref := GroupRef(producer_id, sequence, index))]
        if fresh:
            self._pending.extend(fresh)
            # Usually already in order (segments arrive roughly in commit order): timsort is then linear.
            self._pending.sort(key=_order)
        return len(fresh)

    # --------------------------------------------------------------------------- batches
    def next_batch(self, trainer_version: int, *, partial: bool = False) -> Batch | None:
        """The next batch for a trainer at policy version ``trainer_version``, or None if not enough is pending.

        A batch is ``batch_groups`` complete groups, or (with ``token_budget``) the longest run of
        complete groups that fits the budget; a group larger than the budget is batched alone.
        With ``partial``, whatever is admissible is returned even if short of that (at the end of
        a run); such a batch may hold no groups, only the drops it resolved. Nothing changes when
        None is returned.
        """
        drops: list[tuple[PendingGroup, Admission]] = []
        rebalanced = self._rebalance_left > 0
        if rebalanced:
            admitted = list(self._admitted(self._pending, trainer_version, drops))
            verdicts = {group.ref: verdict for group, verdict in admitted}
            ordered = stratified_order(((stratum_of(group, self.config.restart), group) for group, _ in admitted),
                                       self._mix)
            candidates: Iterable[tuple[PendingGroup, Admission]] = ((group, verdicts[group.ref]) for group in ordered)
        else:
            candidates = self._admitted(self._pending, trainer_version, drops)
        chosen, full, oversized = self._assemble(candidates)
        if not full and not (partial and (chosen or drops)):
            return None
        return self._emit(trainer_version, chosen, drops, rebalanced=rebalanced, oversized=oversized)

    def resolve_drops(self, trainer_version: int) -> tuple[DroppedGroup, ...]:
        """Drop, now, every pending group that admission drops at ``trainer_version``; return them.

        :meth:`next_batch` decides drops lazily, only for groups it scans while filling a batch, and
        changes nothing when it cannot fill one. A trainer waiting for a batch calls this so that
        groups that will never be trained (too stale) are resolved and reported as consumed:
        otherwise a fleet held back by ``max_ahead_groups`` and a trainer waiting for fresh groups
        would wait for each other. It picks the same drops a later batch would have: staleness only
        grows with the trainer's version, and the other built-in drops do not depend on it. The
        cursor moves as for a batch; checkpoint :meth:`state` with the next step.
        """
        drops = [(group, verdict) for group in self._pending
                 if (verdict := self.admission.admit(group, trainer_version)).dropped]
        if not drops:
            return ()
        drops.sort(key=lambda item: item[0].order)
        resolved = {group.ref for group, _ in drops}
        for ref in sorted(resolved):
            self._cursor.resolve(ref, self._segment_sizes[(ref.producer_id, ref.sequence)])
        self._pending = [group for group in self._pending if group.ref not in resolved]
        return tuple(DroppedGroup(ref=group.ref, group_id=group.group.group_id, reason=verdict.drop_reason or "")
                     for group, verdict in drops)

    def wait_for_batch(self, trainer_version: int, *, timeout_s: float | None = None,
                       partial: bool = False) -> Batch | None:
        """Poll every ``poll_interval_s`` until :meth:`next_batch` returns one (None after ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.poll()
            batch = self.next_batch(trainer_version, partial=partial)
            if batch is not None or (deadline is not None and time.monotonic() >= deadline):
                return batch
            time.sleep(self.config.poll_interval_s)

    def _admitted(self, groups: Iterable[PendingGroup], trainer_version: int,
                  drops: list[tuple[PendingGroup, Admission]]) -> Iterator[tuple[PendingGroup, Admission]]:
        # Lazy: in commit order, drops are only decided for groups scanned before the batch fills.
        for group in groups:
            verdict = self.admission.admit(group, trainer_version)
            if verdict.dropped:
                drops.append((group, verdict))
            else:
                yield group, verdict

    def _assemble(self, candidates: Iterable[tuple[PendingGroup, Admission]]
                  ) -> tuple[list[tuple[PendingGroup, Admission]], bool, int]:
        """Take candidates in order until the batch is full: (chosen, full, oversized groups)."""
        budget = self.config.token_budget
        chosen: list[tuple[PendingGroup, Admission]] = []
        tokens = 0
        for group, verdict in candidates:
            if not budget:
                chosen.append((group, verdict))
                if len(chosen) == self.config.batch_groups:
                    return chosen, True, 0
                continue
            if tokens + group.tokens <= budget:
                chosen.append((group, verdict))
                tokens += group.tokens
                if tokens == budget:
                    return chosen, True, 0
            elif not chosen:  # larger than the budget on its own: never let it block the queue
                return [(group, verdict)], True, 1
            else:
                return chosen, True, 0
        return chosen, False, 0

    def _emit(self, trainer_version: int, chosen: list[tuple[PendingGroup, Admission]],
              drops: list[tuple[PendingGroup, Admission]], *, rebalanced: bool, oversized: int) -> Batch:
        chosen.sort(key=lambda item: item[0].order)  # the batch itself is in commit order
        drops.sort(key=lambda item: item[0].order)
        resolved = {group.ref for group, _ in chosen} | {group.ref for group, _ in drops}
        for ref in sorted(resolved):
            self._cursor.resolve(ref, self._segment_sizes[(ref.producer_id, ref.sequence)])
        self._pending = [group for group in self._pending if group.ref not in resolved]
        strata = [stratum_of(group, self.config.restart) for group, _ in chosen]
        if rebalanced:
            self._rebalance_left -= 1  # the mix is the target now; keep it as it was before the restart
        else:
            self._mix = update_mix(self._mix, strata, self.config.restart.mix_decay)
        index = self._batches
        self._batches += 1
        groups = tuple(BatchGroup(ref=group.ref, group=group.group, weight=verdict.weight,
                                  staleness=group.staleness(trainer_version) or 0, tokens=group.tokens,
                                  weight_reason=verdict.weight_reason) for group, verdict in chosen)
        dropped = tuple(DroppedGroup(ref=group.ref, group_id=group.group.group_id, reason=verdict.drop_reason or "")
                        for group, verdict in drops)
        metrics = self._metrics(trainer_version, chosen, drops, rebalanced=rebalanced, oversized=oversized,
                                shortfall=shortfall(strata, self._mix) if rebalanced else 0)
        return Batch(index=index, trainer_version=trainer_version, groups=groups, dropped=dropped,
                     metrics=metrics, state=self.state())

    def _metrics(self, trainer_version: int, chosen: list[tuple[PendingGroup, Admission]],
                 drops: list[tuple[PendingGroup, Admission]], *, rebalanced: bool, oversized: int,
                 shortfall: int) -> BatchMetrics:
        staleness: dict[int, int] = {}
        down_weighted: dict[str, int] = {}
        dropped: dict[str, int] = {}
        lags = [group.ingested_at - group.committed_at for group, _ in chosen]
        for group, verdict in chosen:
            age = group.staleness(trainer_version) or 0
            staleness[age] = staleness.get(age, 0) + 1
            if verdict.weight != 1.0:
                reason = verdict.weight_reason or "down_weighted"
                down_weighted[reason] = down_weighted.get(reason, 0) + 1
        for _, verdict in drops:
            reason = verdict.drop_reason or "dropped"
            dropped[reason] = dropped.get(reason, 0) + 1
        return BatchMetrics(
            groups=len(chosen), trajectories=sum(len(group.group.trajectories) for group, _ in chosen),
            tokens=sum(group.tokens for group, _ in chosen),
            generated_tokens=sum(group.generated_tokens for group, _ in chosen),
            staleness=staleness, dropped=dropped, down_weighted=down_weighted,
            ingest_lag_s_mean=sum(lags) / len(lags) if lags else 0.0, ingest_lag_s_max=max(lags, default=0.0),
            pending=len(self._pending), rebalanced=rebalanced, rebalance_shortfall=shortfall,
            oversized_groups=oversized)

    def close(self) -> None:
        """Stop the ingest threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _order(group: PendingGroup) -> tuple[float, str, int, int]:
    return group.order

