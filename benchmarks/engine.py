"""Engine benchmark: tokens/s of relayrl's torch engine against transformers' own ``generate()``.

Same model (a random Llama-style model of the quickstart's shape, ~1M parameters, and a wider one),
same batch, prompt and generation lengths, same top-p sampling, in the same process. relayrl's
engine also records, for every token, its logprob, kept-set and policy version, and streams each
token to its caller; ``generate()`` records nothing. The ratio is what it costs.

A second table prices routing capture (routing replay, ``docs/algorithms.md``): a mixture-of-experts
model (Qwen3-MoE, 8 experts, top-2) served by the same engine with and without recording every
position's experts (``SamplingParams.routing_from``).

    python benchmarks/engine.py            # batch 8 x 128 new tokens, two model sizes
    python benchmarks/engine.py --quick    # a CI smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results


def build_model(width: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=width, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=4 * width, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def build_moe_model(width: int, layers: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=512, hidden_size=width, num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=width // 4, intermediate_size=4 * width,
                            moe_intermediate_size=width, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                            max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=0, eos_token_id=2,
                            bos_token_id=1)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).eval()


def hf_generate(model, prompts: torch.Tensor, new_tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        output = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_p=0.95,
                                top_k=0, temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                pad_token_id=0)
    elapsed = time.perf_counter() - start
    assert output.shape[1] == prompts.shape[1] + new_tokens
    return elapsed


def relayrl_generate(engine, prompts: torch.Tensor, new_tokens: int, routing: bool = False) -> float:
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams

    requests = [GenerateRequest(request_id=str(index), prompt=row.tolist(),
                                params=SamplingParams(max_tokens=new_tokens, top_p=0.95, seed=index,
                                                      routing_from=0 if routing else None))
                for index, row in enumerate(prompts)]

    async def run():
        return await asyncio.gather(*(engine.generate(request) for request in requests))

    start = time.perf_counter()
    spans = asyncio.run(run())
    elapsed = time.perf_counter() - start
    assert all(len(span) == new_tokens and span.has_kept_sets for span in spans)
    assert all((span.routing is not None) == routing for span in spans)
    return elapsed


def routing_rows(shapes, batch: int, prompt_length: int, new_tokens: int, repeats: int) -> list[str]:
    """Tokens/s of one MoE model served with and without routing capture, interleaved repeats."""
    from relayrl.rollout.engines.torch_engine import TorchEngine

    rows = []
    for width, layers in shapes:
        model = build_moe_model(width, layers)
        parameters = sum(p.numel() for p in model.parameters())
        prompts = torch.randint(3, 512, (batch, prompt_length), generator=torch.Generator().manual_seed(1))
        engine = TorchEngine(model, max_batch=batch)
        relayrl_generate(engine, prompts[:, :4], 4, routing=True)  # warm-up
        plain, recorded = [], []
        for _ in range(repeats):  # interleaved, so drift in the machine's speed hits both alike
            plain.append(relayrl_generate(engine, prompts, new_tokens))
            recorded.append(relayrl_generate(engine, prompts, new_tokens, routing=True))
        tokens = batch * new_tokens
        rows.append(f"| {parameters / 1e6:.1f}M parameters, {layers} MoE layers | {tokens / min(plain):.0f} | "
                    f"{tokens / min(recorded):.0f} | {min(plain) / min(recorded):.2f} |")
        asyncio.run(engine.close())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from relayrl.rollout.engines.torch_engine import TorchEngine

    batch, prompt_length, new_tokens, repeats = (4, 8, 16, 1) if args.quick else (8, 32, 128, 3)
    shapes = [(128, 4)] if args.quick else [(128, 4), (512, 8)]
    revision = commit()
    lines = [f"Batch {batch}, prompt {prompt_length}, {new_tokens} new tokens, top-p 0.95, seeded requests; torch "
             f"{torch.__version__}, {torch.get_num_threads()} threads; best of {repeats}, the same model in the same run:",
             "", "| model | `generate()` tok/s | relayrl tok/s | relayrl / generate |", "|---|---:|---:|---:|"]
    for width, layers in shapes:
        model = build_model(width, layers)
        parameters = sum(p.numel() for p in model.parameters())
        prompts = torch.randint(3, 512, (batch, prompt_length), generator=torch.Generator().manual_seed(1))
        engine = TorchEngine(model, max_batch=batch)
        hf_generate(model, prompts[:, :4], 4)  # warm-up both paths
        relayrl_generate(engine, prompts[:, :4], 4)
        hf = min(hf_generate(model, prompts, new_tokens) for _ in range(repeats))
        ours = min(relayrl_generate(engine, prompts, new_tokens) for _ in range(repeats))
        tokens = batch * new_tokens
        lines.append(f"| {parameters / 1e6:.1f}M parameters | {tokens / hf:.0f} | {tokens / ours:.0f} | {hf / ours:.2f} |")
        asyncio.run(engine.close())
    lines += ["", "Routing capture on a mixture-of-experts model (Qwen3-MoE, 8 experts, top-2), same batch and "
              "lengths, runs interleaved:", "",
              "| model | relayrl tok/s | recording routing tok/s | with / without |", "|---|---:|---:|---:|"]
    lines += routing_rows(shapes, batch, prompt_length, new_tokens, repeats)
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("engine", command=command_line(), markdown=markdown, data={},
                             revision=revision)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
