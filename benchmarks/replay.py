"""Replay benchmark: ``replay_logprobs`` against a dense-mask reference, time and peak memory.

The trainer replays each token's logprob renormalised over its recorded kept-set. The obvious
implementation builds a ``rows x vocab`` boolean mask, fills the logits outside it with ``-inf``
and takes ``log_softmax``: three more ``rows x vocab`` tensors. relayrl gathers the kept logits
(``nnz`` values) and reduces per segment. Both run forward + backward on the same logits and
kept-sets (heavy-tailed sizes as top-p produces them: most tokens near-certain), each in its own
subprocess so that peak memory (max RSS above the shared set-up) is measured cleanly.

    python benchmarks/replay.py            # 8192 rows x 32768 vocab (needs ~8 GiB free)
    python benchmarks/replay.py --quick    # 512 x 4096, a CI smoke run

Ratios are what to read; absolute times vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results


def kept_set_sizes(rows: int, generator) -> list[int]:
    """Top-p (0.95) kept-set sizes: 60% singletons, a quarter 2-4, the rest up to 256."""
    import torch

    roll = torch.rand(rows, generator=generator)
    small = torch.randint(2, 5, (rows,), generator=generator)
    medium = torch.randint(5, 21, (rows,), generator=generator)
    large = torch.randint(21, 257, (rows,), generator=generator)
    sizes = torch.where(roll < 0.60, 1, torch.where(roll < 0.85, small, torch.where(roll < 0.97, medium, large)))
    return sizes.tolist()


def setup(rows: int, vocab: int):
    import torch

    from relayrl.algo.sampling import KeptSets

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=generator)
    sizes = kept_set_sizes(rows, generator)
    ids = [torch.randperm(vocab, generator=generator)[:size] for size in sizes]
    kept = KeptSets(torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()]), torch.cat(ids))
    tokens = torch.stack([row[0] for row in ids])
    return logits, tokens, kept


def run_relayrl(logits, tokens, kept):
    from relayrl.algo.sampling import replay_logprobs

    leaf = logits.requires_grad_()
    replay_logprobs(leaf, tokens, kept).sum().backward()
    return leaf.grad


def run_dense(logits, tokens, kept):
    import torch

    leaf = logits.requires_grad_()
    rows = logits.shape[0]
    mask = torch.zeros(logits.shape, dtype=torch.bool)
    row_index = torch.repeat_interleave(torch.arange(rows), kept.counts())
    mask[row_index, kept.ids] = True
    masked = leaf.masked_fill(~mask, float("-inf"))
    logprobs = torch.log_softmax(masked, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    # Singletons: log_softmax over one element is 0 with zero gradient, as in relayrl.
    logprobs.sum().backward()
    return leaf.grad


def child(method: str, rows: int, vocab: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    logits, tokens, kept = setup(rows, vocab)
    function = {"relayrl": run_relayrl, "dense": run_dense}[method]
    function(logits[:8].clone(), tokens[:8], type(kept)(kept.offsets[:9], kept.ids[: int(kept.offsets[8])]))  # warm-up
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    checksum = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        grad = function(logits.clone(), tokens, kept)
        times.append(time.perf_counter() - start)
        checksum = sum(float(chunk.abs().sum(dtype=torch.float64)) for chunk in grad.split(256))  # small temporaries
        del grad
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": min(times), "extra_peak_mib": (peak - baseline) / 1024, "checksum": checksum,
                      "nnz": int(kept.ids.numel())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a CI smoke run)")
    parser.add_argument("--child", nargs=4, metavar=("METHOD", "ROWS", "VOCAB", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method, rows, vocab, repeats = args.child
        child(method, int(rows), int(vocab), int(repeats))
        return
    rows, vocab, repeats = (512, 4096, 2) if args.quick else (8192, 32768, 3)
    revision = commit()
    results = {}
    for method in ("dense", "relayrl"):
        output = subprocess.run([sys.executable, __file__, "--child", method, str(rows), str(vocab), str(repeats)],
                                capture_output=True, text=True, check=True).stdout
        results[method] = json.loads(output.strip().splitlines()[-1])
    dense, ours = results["dense"], results["relayrl"]
    agreement = abs(dense["checksum"] - ours["checksum"]) / max(dense["checksum"], 1e-12)
    lines = [f"replay_logprobs forward+backward, {rows} rows x {vocab} vocab, fp32 logits "
             f"({rows * vocab * 4 / 2**20:.0f} MiB), {ours['nnz']} kept ids (mean {ours['nnz'] / rows:.1f}/row); "
             f"1 thread; python {platform.python_version()} on {platform.machine()}; best of {repeats}:", "",
             "| method | time s | extra peak MiB | time x | memory x |", "|---|---:|---:|---:|---:|"]
    for name, result in (("dense mask (baseline)", dense), ("relayrl (gather + segment log-sum-exp)", ours)):
        lines.append(f"| {name} | {result['seconds']:.2f} | {result['extra_peak_mib']:.0f} | "
                     f"{result['seconds'] / dense['seconds']:.2f} | "
                     f"{result['extra_peak_mib'] / max(dense['extra_peak_mib'], 1):.2f} |")
    lines += ["", f"x columns relative to the dense baseline, lower is better; gradients agree to {agreement:.0e} "
              "(relative L1)."]
    markdown = "\n".join(lines)
    print(markdown)
    if agreement > 1e-4:
        raise SystemExit("relayrl and the dense reference disagree")
    if not args.quick:
        path = write_results("replay", command=command_line(), markdown=markdown, data=results, revision=revision)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
