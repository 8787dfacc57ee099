"""The trainer step of a real model in float32 against bfloat16 compute (``trainer.compute_dtype``).

Two ``TorchTrainer``\\ s on copies of the same pretrained model (SmolLM2-135M-Instruct, a directory
``relayrl model import-gguf`` wrote) take steps on the same batch of scored groups shaped like
``examples/reasoning.toml``'s (4 groups x 8, prompts of 56 tokens, replies of up to 32, top-p
kept-sets); one computes in float32, the other under bfloat16 autocast with float32 master weights.
Interleaved, best of N each; it prints seconds per step, tokens/s and the ratio against float32 (the
baseline, measured in the same process), and the cosine between the two runs' first updates.

Usage: ``python benchmarks/trainer_precision.py [--model DIR] [--threads N] [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import commit, write_results
from timing import best_time
from trainer_step import make_groups

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct", help="a Hugging Face model directory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (relayrl run's trainer uses 1 here)")
    parser.add_argument("--quick", action="store_true", help="a tiny random model, nothing written")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    revision = commit()
    if args.quick:
        from relayrl.rollout.testing.models import tiny_llama

        model, label, repeats = tiny_llama(seed=0), "a tiny random Llama", 2
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        label, repeats = f"{Path(args.model).name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M)", 3
    vocab = model.config.vocab_size
    batch = make_groups(4, 8, 56, 32, vocab, 16)
    algo = AlgoSection(sampling=SamplingSection(top_p=0.95), optimizer=OptimizerSection(lr=1e-5, muon=False))
    trainers = {dtype: TorchTrainer(copy.deepcopy(model), algo=algo, config=TrainerSection(compute_dtype=dtype), version=1)
                for dtype in ("", "bfloat16")}
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    tokens = 0
    for trainer in trainers.values():  # warm (allocator, optimiser state); also the first updates, compared below
        tokens = int(trainer.step(batch)["tokens/total"])
    deltas = {dtype: torch.cat([(p.detach() - start[name]).flatten() for name, p in trainer.model.named_parameters()])
              for dtype, trainer in trainers.items()}
    cosine = float(torch.nn.functional.cosine_similarity(deltas[""], deltas["bfloat16"], dim=0))
    times: dict[str, list[float]] = {dtype: [] for dtype in trainers}
    for _ in range(repeats):
        for dtype, trainer in trainers.items():
            times[dtype].append(best_time(lambda trainer=trainer: trainer.step(batch), 1)[0])
    full, half = min(times[""]), min(times["bfloat16"])
    lines = [f"{label}, a batch of 4 groups x 8 ({tokens} tokens: prompts of 56, replies of <= 32), AdamW, "
             f"{args.threads} thread(s); best of {repeats}, interleaved.", "",
             "| compute | s/step | tokens/s | time vs float32 |", "|---|---|---|---|",
             f"| float32 (baseline) | {full:.2f} | {tokens / full:,.0f} | 1.00 |",
             f"| bfloat16 autocast, float32 master weights | {half:.2f} | {tokens / half:,.0f} | {half / full:.2f} |",
             "", f"The first updates of the two point the same way: cosine {cosine:.3f}."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("trainer_precision", command=" ".join(["python benchmarks/trainer_precision.py", *(argv or sys.argv[1:])]),
                             markdown=markdown, data={"float32_s": full, "bfloat16_s": half, "tokens": tokens,
                                                      "cosine": cosine, "threads": args.threads}, revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
