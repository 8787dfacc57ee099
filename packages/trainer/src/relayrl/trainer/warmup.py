"""A supervised warm-up before RL: next-token cross-entropy on demonstrations.

RL from a randomly initialised model has no signal: every sample earns 0. A short supervised phase
on demonstrations (the ``[trainer.warmup]`` section; the countdown quickstart uses the expression
that made each target) gives the policy a small but non-zero pass rate, and RL takes it from there.
The loss covers answer tokens only (the prompt is context); a multi-turn demonstration is a
:class:`MaskedExample` whose generated tokens are trained and whose tool results, prompts and
summaries-as-context are not. The optimiser is a fresh AdamW (or Muon for the hidden matrices and
AdamW for the rest) with a linear ramp and an optional cosine decay, discarded afterwards, so RL
starts with its own optimiser state.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence

import torch

from relayrl.trainer.config import WarmupSection

__all__ = ["MaskedExample", "WarmupSection", "supervised_warmup"]


@dataclasses.dataclass(frozen=True)
class MaskedExample:
    """A token sequence and, per token, whether the loss covers it (one segment of a trajectory)."""

    tokens: Sequence[int]
    trained: Sequence[bool]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.trained):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.trained)} trained flags")


Example = tuple[Sequence[int], Sequence[int]] | MaskedExample
"""``(prompt_ids, answer_ids)`` (the answer is trained) or a :class:`MaskedExample`."""


def supervised_warmup(model: torch.nn.Module, examples: Sequence[Example],
                      section: WarmupSection, *, seed: int = 0, pad_token_id: int = 0,
                      on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train ``model`` on ``examples`` for ``section.steps`` steps; return the losses.

    Batches are drawn with a ``random.Random(seed)``, so the warm-up is reproducible.
    """
    if section.steps <= 0:
        return []
    if not examples:
        raise ValueError("the warm-up needs demonstrations: the environment provided none")
    rng = random.Random(seed)
    groups = _warmup_optimizers(model, section)
    optimizers = [optimizer for optimizer, _ in groups]
    losses = []
    model.train()
    for step in range(section.steps):
        factor = _lr_factor(step, section)
        for optimizer, base_lr in groups:
            for group in optimizer.param_groups:
                group["lr"] = base_lr * factor
        chosen = [examples[rng.randrange(len(examples))] for _ in range(section.batch_size)]
        input_ids, labels, attention = _pad(chosen, pad_token_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return losses


def _warmup_optimizers(model: torch.nn.Module, section: WarmupSection) -> list[tuple[torch.optim.Optimizer, float]]:
    """``(optimizer, base learning rate)`` pairs: AdamW alone, or Muon and AdamW split as in RL."""
    if not section.muon:
        return [(torch.optim.AdamW(model.parameters(), lr=section.lr), section.lr)]
    from relayrl.algo.optim import OptimizerSection, build_optimizer

    muon_lr = section.muon_lr if section.muon_lr is not None else section.lr
    combined, _ = build_optimizer(model, OptimizerSection(muon=True, lr=section.lr, muon_lr=muon_lr))
    return [(optimizer, muon_lr if name == "muon" else section.lr) for name, optimizer in combined.optimizers.items()]


def _lr_factor(step: int, section: WarmupSection) -> float:
    """The learning rate's multiplier at ``step``: a linear ramp, then constant or a cosine to 0.1."""
    ramp_steps = max(1, int(section.ramp * section.steps))
    if step < ramp_steps:
        return (step + 1) / ramp_steps
    if section.decay != "cosine":
        return 1.0
    progress = (step - ramp_steps) / max(1, section.steps - ramp_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _masked(example: Example) -> MaskedExample:
    if isinstance(example, MaskedExample):
        return example
    prompt, answer = example
    return MaskedExample([*prompt, *answer], [False] * len(prompt) + [True] * len(answer))


def _pad(examples: Sequence[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    masked = [_masked(example) for example in examples]
    length = max(len(example.tokens) for example in masked)
    input_ids = torch.full((len(masked), length), pad, dtype=torch.long)
    labels = torch.full((len(masked), length), -100, dtype=torch.long)
    attention = torch.zeros((len(masked), length), dtype=torch.long)
    for row, example in enumerate(masked):
        tokens = torch.tensor(list(example.tokens), dtype=torch.long)
        trained = torch.tensor(list(example.trained), dtype=torch.bool)
        input_ids[row, :len(tokens)] = tokens
        labels[row, :len(tokens)] = torch.where(trained, tokens, torch.full_like(tokens, -100))
        attention[row, :len(tokens)] = 1
    return input_ids, labels, attention
