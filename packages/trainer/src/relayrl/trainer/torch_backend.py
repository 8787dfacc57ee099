"""The built-in trainer backend: one process, plain torch.

One :meth:`TorchTrainer.step` per batch of groups:

1. lay the groups out as padded sequences (:func:`relayrl.trainer.batch.build_sequences`);
2. advantages per trajectory from the rewards and groups (``[algo] advantage``);
3. for each micro-batch (``[trainer] micro_batch_tokens``): forward, gather the logits of the
   target positions only, replay their logprobs over the recorded kept-sets, compute the mismatch
   correction against the behaviour logprobs (``[algo] correction``) and the loss (``[algo] loss``)
   with the *global* denominator, and accumulate gradients;
4. clip, one optimiser step (Muon + AdamW), bump the policy version.

There is one optimiser step per batch, so the policy the batch is trained from is the current one:
``old_logprobs`` are the replayed logprobs, detached, and every ratio starts at 1. The
train/inference mismatch is measured (and corrected) between those and the engine's recorded
logprobs. Masked tokens contribute 0 and still count in the denominator, so a batch that the
correction masks heavily takes a proportionally smaller step.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from relayrl.algo.config import AlgoSection, build
from relayrl.algo.correction import MismatchInputs
from relayrl.algo.losses import LossInputs
from relayrl.algo.monitors import behaviour_metrics
from relayrl.algo.optim import build_optimizer
from relayrl.algo.sampling import full_entropy, replay_logprobs
from relayrl.core.wire import Group
from relayrl.trainer.batch import SequenceBatch, build_sequences, split_by_token_budget
from relayrl.trainer.config import TrainerSection

__all__ = ["TorchTrainer"]


class TorchTrainer:
    """Trains a transformers causal LM (or any module returning ``.logits``) on scored groups."""

    def __init__(self, model: torch.nn.Module, *, algo: AlgoSection | None = None, config: TrainerSection | None = None,
                 version: int = 0, pm: Any = None) -> None:
        self.model = model
        self.algo = algo or AlgoSection()
        self.config = config or TrainerSection()
        self.version = version
        self.optimizer, self.optimizer_report = build_optimizer(model, self.algo.optimizer)
        self.advantage = build("relayrl_algo_advantage_estimators", "advantage estimator", self.algo.advantage,
                               self.algo.advantage_options, pm=pm, path="algo.advantage")
        self.loss = build("relayrl_algo_losses", "loss", self.algo.loss, self.algo.loss_options, pm=pm, path="algo.loss")
        self.correction = build("relayrl_algo_mismatch_corrections", "mismatch correction", self.algo.correction,
                                self.algo.correction_options, pm=pm, path="algo.correction")
        self.temperature = self.algo.sampling.temperature

    # ------------------------------------------------------------------ one step
    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """Train on ``groups`` (one optimiser step); return this step's metrics."""
        started = time.perf_counter()
        metrics = self.accumulate_gradients(groups)
        if self.config.grad_clip > 0:
            metrics["grad/norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        elapsed = time.perf_counter() - started
        metrics["trainer/step_s"] = elapsed
        metrics["trainer/tokens_per_s"] = metrics["tokens/total"] / elapsed if elapsed > 0 else 0.0
        metrics["trainer/version"] = float(self.version)
        return metrics

    def accumulate_gradients(self, groups: Sequence[Group]) -> dict[str, float]:
        """Forward and backward over ``groups`` into ``.grad`` (no optimiser step); return metrics."""
        self.model.train()
        batch = build_sequences(groups)
        advantage = self.advantage(batch.rewards(), batch.group_ids)
        sequence_advantages = advantage.advantages[batch.sequence_trajectory]
        staleness = batch.staleness(self.version)
        sums: Counter[str] = Counter()
        denominator = self._denominator(batch)
        for rows, micro in split_by_token_budget(batch, self.config.micro_batch_tokens):
            self._micro_step(micro, sequence_advantages[rows], staleness[rows], denominator, sums)
        metrics = self._finish_metrics(batch, advantage.metrics, staleness, sums)
        return metrics

    def _denominator(self, batch: SequenceBatch) -> float:
        aggregation = getattr(getattr(self.loss, "config", None), "aggregation", "token-mean")
        if aggregation == "token-mean":
            return float(batch.num_targets)
        if aggregation == "constant":
            return float(getattr(self.loss.config, "normalizer", 0.0) or batch.num_targets)
        return float(int((batch.target_mask.sum(dim=1) > 0).sum()))

    def _micro_step(self, micro: SequenceBatch, advantages: torch.Tensor, staleness: torch.Tensor,
                    denominator: float, sums: Counter[str]) -> None:
        logits = self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits[:, :-1]
        targets = micro.target_mask[:, 1:]
        target_logits = logits[targets]
        tokens = micro.input_ids[:, 1:][targets]
        logprobs_flat, kept_entropy = replay_logprobs(target_logits, tokens, micro.kept, temperature=self.temperature,
                                                      return_kept_entropy=True)
        logprobs = torch.zeros(targets.shape, dtype=logprobs_flat.dtype).masked_scatter(targets, logprobs_flat)
        behaviour = micro.behavior_logprobs[:, 1:]
        correction = self.correction(MismatchInputs(old_logprobs=logprobs.detach(), behavior_logprobs=behaviour,
                                                    mask=targets.float(), staleness=staleness))
        output = self.loss(LossInputs(logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=advantages,
                                      mask=correction.mask, is_weights=correction.weights, denominator=denominator))
        loss = output.loss
        entropy = full_entropy(target_logits.detach(), temperature=self.temperature)
        if self.config.entropy_coef:
            log_probs = torch.log_softmax(target_logits.float() / self.temperature, dim=-1)
            entropy_with_grad = -(log_probs.exp() * log_probs).sum(dim=-1)
            loss = loss - self.config.entropy_coef * entropy_with_grad.sum() / max(denominator, 1.0)
        loss.backward()
        count = float(targets.sum())
        sums["loss"] += float(output.loss.detach()) * count
        sums["targets"] += count
        sums["entropy"] += float(entropy.sum())
        sums["kept_entropy"] += float(kept_entropy.sum())
        sums["singletons"] += float((micro.kept.counts() == 1).sum())
        for name, value in {**output.metrics, **correction.metrics}.items():
            if name.endswith(("_min", "_max")):
                sums[name] = min(sums.get(name, value), value) if name.endswith("_min") else max(sums.get(name, value), value)
            else:
                sums[f"weighted:{name}"] += value * count

    def _finish_metrics(self, batch: SequenceBatch, advantage_metrics: dict[str, float], staleness: torch.Tensor,
                        sums: Counter[str]) -> dict[str, float]:
        targets = max(sums["targets"], 1.0)
        rewards = batch.rewards()
        metrics: dict[str, float] = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "loss/value": sums["loss"] / targets,
            "entropy/token_mean": sums["entropy"] / targets,
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
        metrics["staleness/mean"] = float(staleness.float().mean())
        metrics["staleness/max"] = float(staleness.max())
        return metrics

