"""Trainer step throughput: relayrl's TorchTrainer.step against a hand-written torch loop, same loss, same batch.

Both take one optimiser step over the same batch of scored groups on copies of the same model with
the same optimiser (Muon + AdamW, built once by relayrl-algo: the optimiser is not what is
measured). The hand-written loop is what one would write for exactly this configuration: pad the
sequences, one forward, gather target logits, renormalise over the recorded kept-sets with a padded
gather and a masked logsumexp, GRPO advantages, truncated IS (cap 2), PPO-clip at ratio 1
(``exp(lp - lp.detach())``), token-mean, backward, clip, step. The framework adds the general
machinery: CSR kept-sets, micro-batching by token budget, pluggable losses/corrections/estimators,
metrics. First both loops' losses and gradients are checked equal; then tokens/s of each (best of
N, interleaved) and the framework's overhead. Target: overhead <= 10%.

Usage: ``python benchmarks/trainer_step.py [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import commit, write_results
from timing import best_time

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection, build_optimizer
from relayrl.core.arrays import pack_u32
from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer


def make_model(vocab: int, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=4 * hidden, max_position_embeddings=2048,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def make_groups(groups: int, group_size: int, prompt: int, generated: int, vocab: int, kept: int) -> list[Group]:
    rng = random.Random(0)
    result = []
    for g in range(groups):
        trajectories = []
        for i in range(group_size):
            length = rng.randint(generated // 2, generated)
            tokens = [rng.randrange(vocab) for _ in range(length)]
            kept_sets = [sorted({token, *rng.sample(range(vocab), rng.randint(0, kept - 1))}) for token in tokens]
            span = GeneratedSpan.build(tokens, [-rng.random() for _ in tokens], 1, kept=kept_sets)
            turns = [Turn(role="user", tokens=pack_u32([rng.randrange(vocab) for _ in range(prompt)])),
                     Turn(role="assistant", generated=span)]
            trajectories.append(Trajectory(trajectory_id=f"{g}-{i}", task_id=str(g), group_id=str(g), sample_index=i,
                                           reward=float(rng.random() < 0.5), segments=[TrajectorySegment(turns=turns)]))
        result.append(Group(group_id=str(g), task_id=str(g), trajectories=trajectories))
    return result


class HandWritten:
    """The same loss for exactly this configuration, written out directly."""

    def __init__(self, model, optimizer, groups: list[Group], *, cap: float = 2.0, clip: float = 1.0) -> None:
        self.model, self.optimizer, self.cap, self.clip = model, optimizer, cap, clip
        rows = [(t, t.segments[0].turns) for g in groups for t in g.trajectories]
        width = max(len(turns[0].context_token_ids()) + len(turns[1].generated) for _, turns in rows)
        max_kept = max(len(turns[1].generated.kept_set(j)) for _, turns in rows for j in range(len(turns[1].generated)))
        n = len(rows)
        self.input_ids = torch.zeros((n, width), dtype=torch.long)
        self.attention = torch.zeros((n, width), dtype=torch.long)
        self.targets = torch.zeros((n, width), dtype=torch.bool)
        self.behaviour = torch.zeros((n, width))
        kept_ids, kept_mask = [], []
        rewards = torch.tensor([t.reward for t, _ in rows], dtype=torch.float64)
        group_of = torch.tensor([int(t.group_id) for t, _ in rows])
        for r, (_, turns) in enumerate(rows):
            prompt, span = list(turns[0].context_token_ids()), turns[1].generated
            tokens = prompt + list(span.token_ids())
            self.input_ids[r, :len(tokens)] = torch.tensor(tokens)
            self.attention[r, :len(tokens)] = 1
            self.targets[r, len(prompt):len(tokens)] = True
            self.behaviour[r, len(prompt):len(tokens)] = torch.tensor(list(span.token_logprobs()))
            for j in range(len(span)):
                ids = list(span.kept_set(j))
                kept_ids.append(ids + [0] * (max_kept - len(ids)))
                kept_mask.append([True] * len(ids) + [False] * (max_kept - len(ids)))
        self.kept_ids, self.kept_mask = torch.tensor(kept_ids), torch.tensor(kept_mask)
        mean = torch.zeros(int(group_of.max()) + 1, dtype=torch.float64).index_reduce_(0, group_of, rewards, "mean",
                                                                                          include_self=False)
        centred = rewards - mean[group_of]
        counts = torch.bincount(group_of).double()
        std = (torch.zeros_like(mean).index_add_(0, group_of, centred ** 2) / (counts - 1)).sqrt()
        self.advantages = (centred / (std[group_of] + 1e-6)).float()

    def loss(self) -> torch.Tensor:
        logits = self.model(input_ids=self.input_ids, attention_mask=self.attention).logits[:, :-1]
        targets = self.targets[:, 1:]
        target_logits = logits[targets]                                   # [T, V]
        tokens = self.input_ids[:, 1:][targets]
        kept_logits = target_logits.gather(1, self.kept_ids).masked_fill(~self.kept_mask, float("-inf"))
        logprobs = target_logits.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(kept_logits, dim=1)
        weights = (logprobs.detach() - self.behaviour[:, 1:][targets]).exp().clamp(max=self.cap)
        advantages = self.advantages[:, None].expand_as(targets)[targets]
        return -(advantages * weights * (logprobs - logprobs.detach()).exp()).sum() / targets.sum()

    def step(self) -> float:
        loss = self.loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    revision = commit()
    torch.set_num_threads(2)
    if args.quick:
        vocab, hidden, layers, groups, size, prompt, generated, kept, repeats = 512, 64, 2, 2, 4, 16, 32, 8, 2
    else:
        vocab, hidden, layers, groups, size, prompt, generated, kept, repeats = 8192, 256, 4, 8, 8, 128, 384, 16, 5
    model = make_model(vocab, hidden, layers)
    batch = make_groups(groups, size, prompt, generated, vocab, kept)
    algo = AlgoSection(sampling=SamplingSection(top_p=0.95), optimizer=OptimizerSection(lr=1e-5, muon=True))
    config = TrainerSection(micro_batch_tokens=10**9)  # one micro-batch, as the hand-written loop

    # Correctness first: the same loss and the same gradients.
    framework_model, hand_model = copy.deepcopy(model), copy.deepcopy(model)
    trainer = TorchTrainer(framework_model, algo=algo, config=config, version=1)
    metrics = trainer.accumulate_gradients(batch)
    hand = HandWritten(hand_model, build_optimizer(hand_model, algo.optimizer)[0], batch)
    loss = hand.loss()
    loss.backward()
    gradient_gap = max(float((a.grad - b.grad).abs().max()) for a, b in
                       zip(framework_model.parameters(), hand_model.parameters()))
    scale = max(float(a.grad.abs().max()) for a in framework_model.parameters())
    print(f"loss: framework {metrics['loss/value']:.6f}, hand-written {float(loss.detach()):.6f}; "
          f"max gradient difference {gradient_gap:.2e} (largest gradient {scale:.2e})")
    if abs(metrics["loss/value"] - float(loss.detach())) > 1e-4 or gradient_gap > 1e-4 * max(scale, 1e-12):
        print("the two loops do not compute the same loss: the comparison would be meaningless", file=sys.stderr)
        return 1

    tokens = int(metrics["tokens/total"])
    trainer = TorchTrainer(copy.deepcopy(model), algo=algo, config=config, version=1)
    hand_model = copy.deepcopy(model)
    hand = HandWritten(hand_model, build_optimizer(hand_model, algo.optimizer)[0], batch)
    trainer.step(batch)  # warm both (allocator, Muon state)
    hand.step()
    # Interleaved, best of N each: drift of a shared machine hits both loops alike.
    framework_times, hand_times = [], []
    for _ in range(repeats):
        framework_times.append(best_time(lambda: trainer.step(batch), 1)[0])
        hand_times.append(best_time(hand.step, 1)[0])
    framework_s, hand_s = min(framework_times), min(hand_times)
    gradient_line = (f"Both loops' losses agree and their gradients differ by at most {gradient_gap:.1e} "
                     f"(largest gradient {scale:.1e}), checked before timing.")
    lines = [f"Batch: {groups} groups x {size}, {tokens} tokens (prompt {prompt}, generated <= {generated}), "
             f"vocab {vocab}, kept-sets <= {kept}, a {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter "
             f"Llama; {torch.get_num_threads()} threads; best of {repeats}, the loops interleaved.", "",
             "| loop | s/step | tokens/s | speed vs hand-written |", "|---|---|---|---|",
             f"| hand-written torch (baseline) | {hand_s:.3f} | {tokens / hand_s:,.0f} | 1.00 |",
             f"| relayrl TorchTrainer.step | {framework_s:.3f} | {tokens / framework_s:,.0f} | {hand_s / framework_s:.2f} |",
             "", f"Framework overhead: **{100 * (framework_s / hand_s - 1):+.1f}%** (target <= 10%). {gradient_line}"]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        data = {"hand_s": hand_s, "framework_s": framework_s, "tokens": tokens, "gradient_gap": gradient_gap,
                "largest_gradient": scale}
        path = write_results("trainer_step", command="python benchmarks/trainer_step.py", markdown=markdown, data=data,
                             revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
