"""Elastic data parallelism: replicas of a trainer that shrink and regrow by whole replicas.

Each replica holds the whole model (plain data parallelism over the torch backend) and takes every
``world``-th micro-batch of the *same* global batch; advantages and the loss's denominator come
from the whole batch, so the replicas' gradients sum to the whole batch's gradient, whatever the
world size. Gradients are summed with one flat all-reduce (gloo on CPU, NCCL on GPUs), then every
replica takes the same optimiser step. The global batch therefore stays the same when the group
shrinks: the survivors take the dead replica's micro-batches (gradient accumulation).

Membership (:mod:`relayrl.fault_tolerance.membership`): replicas beat; the leader publishes views.

* **Failure.** A replica dies mid-step: the collective fails on the survivors (gloo sees the reset
  connection; otherwise ``timeout_s``). They drop the step's partial gradients, wait until the dead
  replica's heartbeat expires, form the next generation without it, re-synchronise state from the
  new rank 0 and redo the same step on the same batch.
* **Regrowth.** A (re)started replica beats and waits. At the next step boundary the leader sees it
  alive, publishes a view with it, every current member learns the decision through a broadcast on
  the current group (so all switch at the same step), and the group re-forms; the newcomer receives
  the model, optimiser state and step from rank 0.

The rollout side is untouched throughout: only rank 0 talks to the buffer and publishes weights.
"""

from __future__ import annotations

import datetime
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from relayrl.core.wire import Group
from relayrl.fault_tolerance.membership import Heartbeat, View

__all__ = ["ElasticTrainer"]


class ElasticTrainer:
    """A TorchTrainer replica in an elastic data-parallel group (see the module docstring)."""

    def __init__(self, trainer: Any, membership: Any, member_id: str, rendezvous_dir: str | Path, *,
                 timeout_s: float = 20.0, join_timeout_s: float = 120.0, heartbeat_s: float = 0.3) -> None:
        self.trainer = trainer
        self.membership = membership
        self.member_id = member_id
        self.rendezvous_dir = Path(rendezvous_dir)
        self.rendezvous_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.join_timeout_s = join_timeout_s
        self.steps_done = 0
        self.view: View | None = None
        self.regroups = 0
        self._started = time.time()
        self.heartbeat = Heartbeat(membership, member_id, interval_s=heartbeat_s)
        self._join_after(0)

    # ------------------------------------------------------------------ membership
    @property
    def rank(self) -> int:
        assert self.view is not None
        return self.view.rank(self.member_id)

    @property
    def world_size(self) -> int:
        assert self.view is not None
        return self.view.world_size

    def _form(self, view: View) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.FileStore(str(self.rendezvous_dir / f"generation-{view.generation}"), view.world_size)
        dist.init_process_group("gloo", store=store, rank=view.rank(self.member_id), world_size=view.world_size,
                                timeout=datetime.timedelta(seconds=self.timeout_s))
        self.view = view
        self.regroups += 1
        self._sync_state()

    def _sync_state(self) -> None:
        """Every replica takes rank 0's model, optimiser state, version and step count."""
        if self.world_size == 1:
            return
        payload = [None]
        if self.rank == 0:
            buffer = io.BytesIO()
            torch.save({"trainer": self.trainer.state_dict(), "steps_done": self.steps_done}, buffer)
            payload = [buffer.getvalue()]
        dist.broadcast_object_list(payload, src=0)
        if self.rank != 0:
            state = torch.load(io.BytesIO(payload[0]), weights_only=False)
            self.trainer.load_state_dict(state["trainer"])
            self.steps_done = int(state["steps_done"])

    def _maybe_regrow(self) -> None:
        """At a step boundary: rank 0 admits alive newcomers; all members switch together."""
        decision: list[Any] = [None]
        if self.rank == 0:
            newcomers = sorted(set(self.membership.alive()) - set(self.view.members))  # type: ignore[union-attr]
            if newcomers:
                decision = [self.membership.propose([*self.view.members, *newcomers])]  # type: ignore[union-attr]
        if self.world_size > 1:
            dist.broadcast_object_list(decision, src=0)
        if decision[0] is not None:
            self._form(decision[0])

    def _recover(self) -> None:
        """After a failed collective: wait for the dead to expire, form the next generation, resync."""
        for parameter in self.trainer.model.parameters():
            parameter.grad = None  # the failed step's partial gradients
        failed = self.view.generation  # type: ignore[union-attr]
        # A dead replica is noticed when its heartbeat expires; a replica restarted meanwhile under
        # the same id keeps it "alive", so the wait is bounded and the group re-forms regardless.
        deadline = time.monotonic() + 3 * self.membership.ttl_s
        while time.monotonic() < deadline and set(self.membership.alive()) >= set(self.view.members):  # type: ignore[union-attr]
            time.sleep(0.1)
        self._join_after(failed)

    def _join_after(self, generation: int) -> None:
        """Enter a group newer than ``generation``.

        The proposer is the first surviving member of the current view (so the state source is a
        replica that was training), or the smallest alive id when no member of it survives. A
        replica joining a running group waits for its rank 0 to admit it at a step boundary.
        """
        started = self._started
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            alive = set(self.membership.alive()) | {self.member_id}
            current = self.membership.view()
            survivors = [m for m in (current.members if current else []) if m in alive]
            if survivors and self.member_id in survivors:
                if survivors[0] == self.member_id:  # lead the re-formation after a failure
                    self.membership.propose([*survivors, *sorted(alive - set(survivors))], after=generation)
            elif not survivors and min(alive) == self.member_id:  # no group yet, or nobody of it left
                self.membership.propose(sorted(alive), after=generation)
            view = self.membership.view()
            if (view is not None and view.generation > generation and self.member_id in view.members
                    and (generation > 0 or view.time >= started)):
                self._form(view)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.member_id}: no replica group after generation {generation}")
            time.sleep(0.05)

    # ------------------------------------------------------------------ training
    def step(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None) -> dict[str, float]:
        """One data-parallel optimiser step over the global batch ``groups`` (the same on every replica)."""
        from relayrl.trainer.distributed import all_reduce_gradients, all_reduce_metric_sums

        while True:
            try:
                self._maybe_regrow()
                started = time.perf_counter()
                metrics = self.trainer.accumulate_gradients(
                    groups, weights=weights, shard=(self.rank, self.world_size),
                    reduce_sums=all_reduce_metric_sums if self.world_size > 1 else None)
                if self.world_size > 1:
                    all_reduce_gradients(list(self.trainer.model.parameters()))
                break
            except (RuntimeError, dist.DistBackendError, ConnectionError) as failure:
                if not dist.is_initialized():
                    raise
                self.last_failure = f"{type(failure).__name__}: {failure}"
                self._recover()
        metrics.update(self.trainer.apply_gradients())
        self.steps_done += 1
        metrics["elastic/world_size"] = float(self.world_size)
        metrics["elastic/generation"] = float(self.view.generation)  # type: ignore[union-attr]
        metrics["trainer/step_s"] = time.perf_counter() - started
        return metrics

    def close(self) -> None:
        self.heartbeat.stop()
        if dist.is_initialized():
            dist.destroy_process_group()
