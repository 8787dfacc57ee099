"""Benchmark 1: compression of XOR deltas on a synthetic bf16 model under Adam-like updates.

For each learning rate, one Adam-like step of an fp32 master copy (weights ~N(0, 0.02)) re-rounded
to bf16; then every delta codec encodes the change, and the full codecs encode the snapshot. Prints
the fraction of bf16 values that changed and, per codec, the size ratio (model bytes / stored bytes)
and single-thread encode and decode speed in MB/s of model bytes. Decoding is checked bit-exact.

    python benchmarks/weight_sync/compression.py            # 128M parameters (256 MiB of bf16)
    python benchmarks/weight_sync/compression.py --quick    # 4M parameters, for CI
"""

from __future__ import annotations

import argparse

import numpy as np
from common import MIB, Report, best_of, machine

from relayrl.weight_sync.codecs import DecodeItem, EncodeItem, make_codec
from relayrl.weight_sync.parallel import ChunkPool
from relayrl.weight_sync.testing.synthetic import adam_like_step, bf16_bits, init_master

DELTA_CODECS = ["xor-zstd", "xor-planes-zstd", "xor-sparse-zstd"]
FULL_CODECS = ["zstd", "planes-zstd"]
LEARNING_RATES = [1e-7, 1e-6, 1e-5]


def measure(codec_name: str, new: np.ndarray, base: np.ndarray | None, pool: ChunkPool, repeats: int) -> tuple[float, float, float]:
    codec = make_codec(codec_name)
    encode_s, encoded = best_of(repeats, lambda: codec.encode_many([EncodeItem(new, base, 2)], pool)[0])
    out = np.empty_like(new)
    decode_s, [checksum] = best_of(repeats, lambda: codec.decode_many(
        [DecodeItem(memoryview(encoded.payload).cast("B"), base, out, 2)], pool))
    assert np.array_equal(out, new) and checksum == encoded.checksum, f"{codec_name}: round trip is not bit-exact"
    return new.size / len(memoryview(encoded.payload).cast("B")), new.size / encode_s / 1e6, new.size / decode_s / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4M parameters, one repeat (a CI smoke run)")
    parser.add_argument("--params", type=int, default=0, help="number of parameters (default 128M, quick 4M)")
    args = parser.parse_args()
    params = args.params or (4 * MIB if args.quick else 128 * MIB)
    repeats = 1 if args.quick else 3
    print(machine())
    report = Report("compression")
    report.say(f"{params / 1e6:.0f}M bf16 parameters ({2 * params / MIB:.0f} MiB) ~N(0, 0.02), fp32 master, one Adam-like "
               f"step at each lr, one thread, best of {repeats}:")
    report.say()
    rows = []
    with ChunkPool(1) as pool:
        for lr in LEARNING_RATES:
            master = init_master(params, seed=0)
            rng = np.random.default_rng(1)
            adam_like_step(master, lr, rng)          # a first step so that the master is not exactly bf16
            base = bf16_bits(master).view(np.uint8)
            adam_like_step(master, lr, rng)
            new = bf16_bits(master).view(np.uint8)
            changed = float(np.mean(base.view(np.uint16) != new.view(np.uint16)))
            for name in DELTA_CODECS:
                ratio, encode, decode = measure(name, new, base, pool, repeats)
                rows.append([f"{lr:g}", f"{100 * changed:.2f}%", name, f"{ratio:.1f}x", f"{encode:.0f}", f"{decode:.0f}"])
        for name in FULL_CODECS:
            ratio, encode, decode = measure(name, new, None, pool, repeats)
            rows.append(["snapshot", "100%", name, f"{ratio:.2f}x", f"{encode:.0f}", f"{decode:.0f}"])
    report.table(["lr", "values changed", "codec", "ratio", "encode MB/s", "decode MB/s"], rows)
    report.say()
    report.say("Ratio: model bytes / stored bytes. MB/s: model bytes per second on one thread (encode includes the "
               "XOR and the checksum; decode includes the XOR onto the base and the checksum of the result).")
    report.save(args.quick)


if __name__ == "__main__":
    main()
