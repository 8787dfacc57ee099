"""The training objective of one batch, shared by every trainer backend.

A backend owns the model, its forward/backward and the optimiser; :class:`BatchObjective` owns what
happens between the logits and the scalar to differentiate: gathering the logits of target
positions, replaying their logprobs over the recorded kept-sets, the mismatch correction against
the behaviour logprobs, the configured loss with the batch's global denominator, an optional
entropy bonus, the per-step metrics, and (mixture-of-experts models) routing replay around the
backend's forward and backward (:meth:`BatchObjective.routing`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from relayrl.algo.config import AlgoSection, build
from relayrl.algo.correction import MismatchInputs
from relayrl.algo.hookspecs import ADVANTAGE_ESTIMATORS, LOSSES, MISMATCH_CORRECTIONS
from relayrl.algo.losses import LossInputs
from relayrl.algo.monitors import behaviour_metrics
from relayrl.algo.routing import RouterInfo, moe_routers, recorded_routing
from relayrl.algo.sampling import full_entropy, replay_logprobs
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import Group
from relayrl.trainer.batch import SequenceBatch, build_sequences

__all__ = ["BatchObjective", "PreparedBatch"]


@dataclasses.dataclass
class PreparedBatch:
    """A batch laid out for training, with what every micro-batch needs from the whole of it."""

    batch: SequenceBatch
    sequence_advantages: torch.Tensor
    """``[S]``: the advantage of each sequence's trajectory."""
    staleness: torch.Tensor
    """``[S]``: trainer version minus each sequence's oldest token version."""
    denominator: float
    """The loss's global normaliser over the whole batch."""
    advantage_metrics: dict[str, float]


class BatchObjective:
    """Advantage estimator, loss and correction from ``[algo]``, applied micro-batch by micro-batch."""

    def __init__(self, algo: AlgoSection, *, entropy_coef: float = 0.0, entropy_metric_tokens: int = 2048,
                 pm: PluginManager | None = None) -> None:
        self.advantage = build(ADVANTAGE_ESTIMATORS, algo.advantage, algo.advantage_options, pm=pm, path="algo.advantage")
        self.loss = build(LOSSES, algo.loss, algo.loss_options, pm=pm, path="algo.loss")
        self.correction = build(MISMATCH_CORRECTIONS, algo.correction, algo.correction_options, pm=pm,
                                path="algo.correction")
        self.temperature = algo.sampling.temperature
        self.routing_replay = algo.routing_replay
        self._routers: tuple[int, list[RouterInfo]] | None = None
        self._warned_no_routing = False
        self.entropy_coef = entropy_coef
        self.entropy_metric_tokens = entropy_metric_tokens
        self._keeps_logits: tuple[int, bool] | None = None

    def prepare(self, groups: Sequence[Group], version: int, *, weights: Sequence[float] | None = None) -> PreparedBatch:
        """Lay ``groups`` out and compute advantages, staleness and the global denominator.

        ``weights`` (one per group, e.g. the buffer's down-weighting of stale groups) scale the
        advantages of every trajectory of their group, so a half-weight group pushes half as hard.
        """
        batch = build_sequences(groups)
        advantage = self.advantage(batch.rewards(), batch.group_ids)
        advantages = advantage.advantages
        if weights is not None:
            if len(weights) != len(groups):
                raise ValueError(f"{len(weights)} weights for {len(groups)} groups")
            advantages = advantages * torch.tensor(list(weights), dtype=advantages.dtype)[batch.group_ids]
        return PreparedBatch(batch=batch, sequence_advantages=advantages[batch.sequence_trajectory],
                             staleness=batch.staleness(version), denominator=self.denominator(batch),
                             advantage_metrics=advantage.metrics)

    def denominator(self, batch: SequenceBatch) -> float:
        """The global normaliser of the loss's aggregation over the whole batch (all micro-batches, all ranks)."""
        aggregation = self.loss.aggregation
        if aggregation == "token-mean":
            return float(batch.num_targets)
        if aggregation == "constant":
            return float(self.loss.normalizer or batch.num_targets)
        return float(int((batch.target_mask.sum(dim=1) > 0).sum()))

    def routing(self, model: torch.nn.Module, micro: SequenceBatch, sums: Counter[str]) -> contextlib.AbstractContextManager[None]:
        """Wrap a micro-batch's forward *and* backward: with ``[algo] routing_replay`` a mixture-of-experts
        model routes every recorded position as the engine did; either way the agreement between the
        trainer's routers and the engine's record is summed into ``sums`` (``routing/*`` metrics).
        A dense model, or a batch without routing records, runs as it is."""
        if self._routers is None or self._routers[0] != id(model):
            self._routers = (id(model), moe_routers(model))
        routers = self._routers[1]
        if not routers:
            return contextlib.nullcontext()
        if micro.routing is None or micro.routing_mask is None:
            if self.routing_replay and not self._warned_no_routing:
                self._warned_no_routing = True
                print("trainer: routing replay is on, but the rollouts carry no routing record (an engine that "
                      "cannot capture it?): the trainer routes these tokens with its own routers", file=sys.stderr)
            return contextlib.nullcontext()
        return recorded_routing(routers, micro.routing, micro.routing_mask, force=self.routing_replay, stats=sums)

    def forward(self, model: torch.nn.Module, micro: SequenceBatch, *, call: Any = None,
                device: torch.device | None = None) -> tuple[torch.Tensor, int]:
        """Run ``model`` (or ``call``, e.g. a DeepSpeed engine around it) on ``micro`` moved to ``device``
        (default: the model's): ``(logits, offset)``.

        The logits cover positions ``offset`` to the end. A model whose forward takes transformers'
        ``logits_to_keep`` projects onto the vocabulary only from the first position that predicts a
        target: prompts are most of a batch's positions, and the vocabulary projection of a small
        model with a large vocabulary (and its backward) is a large share of its step (a quarter of
        SmolLM2-135M's at 56-token prompts). The kept positions' logits are the same computation.
        """
        call = model if call is None else call
        device = next(model.parameters()).device if device is None else device
        inputs = {"input_ids": micro.input_ids.to(device), "attention_mask": micro.attention_mask.to(device)}
        length = micro.input_ids.shape[1]
        predicting = micro.target_mask[:, 1:].any(dim=0).nonzero()  # positions whose next token is a target
        offset = int(predicting[0]) if predicting.numel() else 0
        if offset > 0 and self._takes_logits_to_keep(model):
            return call(**inputs, logits_to_keep=length - offset).logits, offset
        return call(**inputs).logits, 0

    def _takes_logits_to_keep(self, model: torch.nn.Module) -> bool:
        if self._keeps_logits is None or self._keeps_logits[0] != id(model):
            try:
                takes = "logits_to_keep" in inspect.signature(model.forward).parameters
            except (TypeError, ValueError):  # a forward without an inspectable signature
                takes = False
            self._keeps_logits = (id(model), takes)
        return self._keeps_logits[1]

    def micro_loss(self, logits: torch.Tensor, micro: SequenceBatch, advantages: torch.Tensor,
                   staleness: torch.Tensor, denominator: float, sums: Counter[str], *,
                   logits_offset: int = 0) -> torch.Tensor:
        """The scalar to differentiate for one micro-batch, given the model's logits ``[S, L - logits_offset, V]``
        (positions ``logits_offset`` to the end, as :meth:`forward` returns them)."""
        # Position l's logits predict token l + 1. The targets' rows are picked from the flattened logits
        # with one index_select: its backward writes a single [S * L, V] gradient (slicing off the last
        # position first, then masking, would materialise a second one: a fifth of a large-vocabulary step).
        sequences, length, vocab = logits.shape
        targets = micro.target_mask[:, 1:]
        where = targets.nonzero()  # row-major: the order of logits[:, :-1][targets]
        if where.numel() and int(where[:, 1].min()) < logits_offset:
            raise ValueError(f"a target is predicted at position {int(where[:, 1].min())}, before the logits' "
                             f"first position {logits_offset}")
        rows = where[:, 0] * length + (where[:, 1] - logits_offset)
        target_logits = logits.reshape(sequences * length, vocab).index_select(0, rows)
        tokens = micro.input_ids[:, 1:][targets]
        logprobs_flat, kept_entropy = replay_logprobs(target_logits, tokens, micro.kept, temperature=self.temperature,
                                                      return_kept_entropy=True)
        logprobs = torch.zeros(targets.shape, dtype=logprobs_flat.dtype,
                               device=logprobs_flat.device).masked_scatter(targets, logprobs_flat)
        behaviour = micro.behavior_logprobs[:, 1:]
        correction = self.correction(MismatchInputs(old_logprobs=logprobs.detach(), behavior_logprobs=behaviour,
                                                    mask=targets.float(), staleness=staleness))
        output = self.loss(LossInputs(logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=advantages,
                                      mask=correction.mask, is_weights=correction.weights, denominator=denominator))
        loss = output.loss
        if self.entropy_coef:
            log_probs = torch.log_softmax(target_logits.float() / self.temperature, dim=-1)
            entropy_with_grad = -(log_probs.exp() * log_probs).sum(dim=-1)
            loss = loss - self.entropy_coef * entropy_with_grad.sum() / max(denominator, 1.0)
            entropy = entropy_with_grad.detach()
        else:
            # The metric needs a softmax over the whole vocabulary at every target: on a large batch
            # that costs a fifth of the step. An evenly strided sample of positions estimates it.
            stride = -(-target_logits.shape[0] // self.entropy_metric_tokens) if self.entropy_metric_tokens > 0 else 1
            entropy = full_entropy(target_logits.detach()[::stride], temperature=self.temperature)
        count = float(targets.sum())
        # Micro-batch losses are already divided by the global denominator: they add up to the loss.
        sums["loss"] += float(output.loss.detach())
        sums["targets"] += count
        sums["entropy"] += float(entropy.sum())
        sums["entropy_tokens"] += float(entropy.numel())
        sums["kept_entropy"] += float(kept_entropy.sum())
        sums["singletons"] += float((micro.kept.counts() == 1).sum())
        for name, value in {**output.metrics, **correction.metrics}.items():
            if name.endswith(("_min", "_max")):
                sums[name] = min(sums.get(name, value), value) if name.endswith("_min") else max(sums.get(name, value), value)
            else:
                sums[f"weighted:{name}"] += value * count
        return loss

    def metrics(self, batch: SequenceBatch, advantage_metrics: dict[str, float], staleness: torch.Tensor,
                sums: Counter[str]) -> dict[str, float]:
        """The step's metrics from the whole batch and the sums :meth:`micro_loss` accumulated."""
        targets = max(sums["targets"], 1.0)
        rewards = batch.rewards()
        metrics: dict[str, float] = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "loss/value": sums["loss"],
            "entropy/token_mean": sums["entropy"] / max(sums["entropy_tokens"], 1.0),
            "entropy/kept_mean": sums["kept_entropy"] / targets,
            "tokens/targets": sums["targets"],
            "tokens/total": float(batch.num_tokens),
            "tokens/singleton_fraction": sums["singletons"] / targets,
            "batch/groups": float(int(batch.group_ids.max()) + 1),
            "batch/trajectories": float(len(batch.trajectories)),
            "batch/sequences": float(batch.input_ids.shape[0]),
            **advantage_metrics,
            **behaviour_metrics(batch.trajectories),
        }
        for name, value in sums.items():
            if name.startswith("weighted:"):
                metrics[name.removeprefix("weighted:")] = value / targets
            elif name.endswith(("_min", "_max")):
                metrics[name] = value
        for lag, count in sorted(Counter(staleness.tolist()).items()):
            metrics[f"staleness/hist/{lag}"] = float(count)
        if sums["routing/compared"]:
            # Shares of recorded (position, layer) pairs where the trainer's own router disagrees with
            # the engine's: its first choice, or its set of experts (replay then overrides it).
            metrics["routing/top1_differs"] = sums["routing/top1_differs"] / sums["routing/compared"]
            metrics["routing/set_differs"] = sums["routing/set_differs"] / sums["routing/compared"]
            metrics["routing/replayed"] = float(self.routing_replay)
        if batch.routing_dropped:
            metrics["routing/dropped_spans"] = float(batch.routing_dropped)
        metrics["staleness/mean"] = float(staleness.float().mean())
        metrics["staleness/max"] = float(staleness.max())
        return metrics

