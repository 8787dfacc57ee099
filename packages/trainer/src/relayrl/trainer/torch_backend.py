"""The built-in trainer backend: one process, plain torch.

One :meth:`TorchTrainer.step` per batch of groups:

1. lay the groups out as padded sequences (:func:`relayrl.trainer.batch.build_sequences`);
2. advantages per trajectory from the rewards and groups (``[algo] advantage``);
3. for each micro-batch (``[trainer] micro_batch_tokens``): forward, then
   :meth:`BatchObjective.micro_loss` (replay over kept-sets, mismatch correction, loss with the
   batch's *global* denominator), backward, accumulating gradients;
4. clip, one optimiser step (Muon + AdamW), bump the policy version.

Data parallelism: when torch.distributed's default group has more than one rank (``[trainer]
ranks``), every rank holds the whole model, runs its share of the micro-batches of the *same*
batch, and the gradients and metric sums are summed over ranks before the (identical) optimiser
step; the batch's gradient does not depend on the number of ranks, so the group can shrink and
regrow between steps (``[trainer] elastic``).

There is one optimiser step per batch, so the policy the batch is trained from is the current one:
``old_logprobs`` are the replayed logprobs, detached, and every ratio starts at 1. The
train/inference mismatch is measured (and corrected) between those and the engine's recorded
logprobs. Masked tokens contribute 0 and still count in the denominator, so a batch that the
correction masks heavily takes a proportionally smaller step.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import build_optimizer
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import Group
from relayrl.trainer.batch import split_by_token_budget
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.objective import BatchObjective

__all__ = ["TorchTrainer"]


class TorchTrainer:
    """Trains a transformers causal LM (or any module returning ``.logits``) on scored groups."""

    def __init__(self, model: torch.nn.Module, *, algo: AlgoSection | None = None, config: TrainerSection | None = None,
                 version: int = 0, pm: PluginManager | None = None) -> None:
        self.model = model
        self.algo = algo or AlgoSection()
        self.config = config or TrainerSection()
        self.version = version
        self.optimizer, self.optimizer_report = build_optimizer(model, self.algo.optimizer)
        self.objective = BatchObjective(self.algo, entropy_coef=self.config.entropy_coef,
                                        entropy_metric_tokens=self.config.entropy_metric_tokens, pm=pm)
        self.weight_guard: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        """Entered around each change of the parameters (the optimiser step and the version bump): an
        engine that shares these parameters (``[rollout] colocate``) pauses inside it, so every decode
        step sees one version's weights whole."""

    def step(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None) -> dict[str, float]:
        """Train on ``groups`` (one optimiser step; ``weights`` scale each group's advantages); return metrics."""
        from relayrl.trainer.distributed import all_reduce_gradients, all_reduce_metric_sums, data_parallel_group

        started = time.perf_counter()
        group = data_parallel_group()
        # A step redone after a failed collective must not add to the failed attempt's gradients.
        self.optimizer.zero_grad(set_to_none=True)
        try:
            if group is None:
                metrics = self.accumulate_gradients(groups, weights=weights)
            else:
                metrics = self.accumulate_gradients(groups, weights=weights, shard=(group.rank, group.world),
                                                    reduce_sums=lambda sums: all_reduce_metric_sums(sums, group))
                all_reduce_gradients([p for p in self.model.parameters() if p.requires_grad], group)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        metrics.update(self.apply_gradients())
        elapsed = time.perf_counter() - started
        metrics["trainer/step_s"] = elapsed
        metrics["trainer/tokens_per_s"] = metrics["tokens/total"] / elapsed if elapsed > 0 else 0.0
        metrics["trainer/version"] = float(self.version)
        return metrics

    def apply_gradients(self) -> dict[str, float]:
        """Clip, take the optimiser step on the accumulated gradients, bump the version."""
        metrics = {}
        if self.config.grad_clip > 0:
            metrics["grad/norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
        with self.weight_guard():
            self.optimizer.step()
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)
        return metrics

    def named_full_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model's state dict, one tensor at a time: what weight sync publishes (every rank
        holds the whole model, so this is its own state dict)."""
        yield from self.model.state_dict().items()

    def state_dict(self) -> dict[str, object]:
        """Model, optimiser and version: what a checkpoint needs from the trainer."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict[str, object]) -> None:
        with self.weight_guard():
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])

    def _compute_precision(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` to ``compute_dtype`` around a forward (its backward follows the same casts)."""
        if not self.config.compute_dtype:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=getattr(torch, self.config.compute_dtype))

    def accumulate_gradients(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None,
                             shard: tuple[int, int] = (0, 1),
                             reduce_sums: Callable[[Counter[str]], Counter[str]] | None = None) -> dict[str, float]:
        """Forward and backward over ``groups`` into ``.grad`` (no optimiser step); return metrics.

        Data parallelism: with ``shard=(rank, world)`` this replica runs every ``world``-th
        micro-batch from ``rank``; advantages and the loss's denominator still come from the whole
        batch, so the replicas' gradients *sum* to the whole batch's (all-reduce them), and
        ``reduce_sums`` (an all-reduce of the metric sums) makes the metrics the whole batch's.
        """
        self.model.train()
        prepared = self.objective.prepare(groups, self.version, weights=weights)
        sums: Counter[str] = Counter()
        rank, world = shard
        for rows, micro in split_by_token_budget(prepared.batch, self.config.micro_batch_tokens)[rank::world]:
            with self.objective.routing(self.model, micro, sums), self._compute_precision():
                logits, offset = self.objective.forward(self.model, micro)
                self.objective.micro_loss(logits, micro, prepared.sequence_advantages[rows], prepared.staleness[rows],
                                          prepared.denominator, sums, logits_offset=offset).backward()
        if reduce_sums is not None:
            sums = reduce_sums(sums)
        return self.objective.metrics(prepared.batch, prepared.advantage_metrics, prepared.staleness, sums)
