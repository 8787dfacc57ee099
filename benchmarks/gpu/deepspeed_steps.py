"""A few relayrl trainer steps on DeepSpeed ZeRO, and publishing the result: the GPU check's trainer half.

Builds a Llama from a config (about 0.5B parameters by default; random weights, no downloads), wraps
it in relayrl's ``DeepSpeedTrainer`` (ZeRO stage, bf16), trains on synthetic scored groups with
recorded kept-sets (the batch builder of ``benchmarks/trainer_step.py``), and times each step and a
full weight publish (tensor-by-tensor gather, XOR delta, zstd) into a local store.

Run with ``torchrun --nproc_per_node=N benchmarks/gpu/deepspeed_steps.py [--quick]``; on a CPU the
``--quick`` sizes run on gloo (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_step import make_groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--zero-stage", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--generated", type=int, default=512)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.steps, args.groups, args.group_size, args.generated = \
            128, 2, 512, 2, 2, 4, 32
    from transformers import LlamaConfig, LlamaForCausalLM

    from relayrl.algo.config import AlgoSection
    from relayrl.core.store import open_store
    from relayrl.trainer.config import TrainerSection
    from relayrl.weight_sync import Publisher
    from relayrl_deepspeed.backend import DeepSpeedTrainer
    from relayrl_deepspeed.config import DeepSpeedSection

    on_gpu = torch.cuda.is_available()
    heads = max(1, args.hidden // 64)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         intermediate_size=int(args.hidden * 2.75) // 64 * 64, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if on_gpu:
        model = model.cuda()
    parameters = sum(p.numel() for p in model.parameters())
    trainer = DeepSpeedTrainer(model, algo=AlgoSection(), config=TrainerSection(),
                               deepspeed=DeepSpeedSection(zero_stage=args.zero_stage, bf16=on_gpu))
    rank = dist.get_rank()
    groups = make_groups(args.groups, args.group_size, 128, args.generated, args.vocab, 32)
    tokens = sum(len(t.segments[0].turns[1].generated) for g in groups for t in g.trajectories)
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        metrics = trainer.step(groups)
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if rank == 0:
            print(f"step {step + 1}: {times[-1]:.2f} s, loss {metrics.get('loss/value', float('nan')):.4f}", flush=True)
    store = open_store(tempfile.mkdtemp(prefix="relayrl-ds-publish-")) if rank == 0 else None
    start = time.perf_counter()
    full = dict(trainer.named_full_parameters())  # every rank takes part in each gather
    gathered_s = time.perf_counter() - start
    if rank == 0:
        publisher = Publisher(store, background=False)
        start = time.perf_counter()
        publisher.publish(full).result()
        first_s = time.perf_counter() - start
        print(f"{parameters / 1e6:.0f}M parameters, ZeRO-{args.zero_stage}, {'bf16 GPU' if on_gpu else 'fp32 CPU'}, "
              f"world {dist.get_world_size()}: step {min(times[1:] or times):.2f} s best "
              f"({tokens / min(times[1:] or times):.0f} generated tokens/s), gather {gathered_s:.2f} s, "
              f"first publish (snapshot) {first_s:.2f} s")
        publisher.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
