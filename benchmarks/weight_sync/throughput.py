"""Benchmark 2: single-core throughput of the delta codec against bare zstd and memcpy on the same buffer.

A bf16 model buffer with one Adam-like step at lr 1e-6 (a few percent of values changed). Pinned to
one core, it times, in model bytes per second:

* memcpy of the buffer (into touched memory);
* bare zstd level 1 compression of the precomputed XOR, in the codec's 4 MiB chunks, and bare
  decompression into a reused buffer: the ceiling for the codec;
* the codec's encode (XOR + zstd + checksum of the new bits) and decode+apply (zstd + XOR of the
  base into the result buffer + checksum of the result, as a controller stages a version).

    python benchmarks/weight_sync/throughput.py            # 256 MiB buffer
    python benchmarks/weight_sync/throughput.py --quick    # 16 MiB, for CI
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import zstandard
from common import MIB, Report, best_of, machine

from relayrl.weight_sync.codecs import DecodeItem, EncodeItem, make_codec
from relayrl.weight_sync.parallel import ChunkPool
from relayrl.weight_sync.testing.synthetic import adam_like_step, bf16_bits, init_master

CHUNK = 4 * MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB buffer, one repeat (a CI smoke run)")
    parser.add_argument("--codecs", default="xor-zstd,xor-planes-zstd,xor-sparse-zstd")
    args = parser.parse_args()
    size = 16 * MIB if args.quick else 256 * MIB
    repeats = 1 if args.quick else 5
    print(machine())
    report = Report("throughput")
    report.say(f"A {size // MIB} MiB bf16 buffer after one lr 1e-6 step, the process pinned to one core, best of {repeats}:")
    report.say()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # one core, as the targets are per core

    master = init_master(size // 2, seed=0)
    rng = np.random.default_rng(1)
    adam_like_step(master, 1e-6, rng)
    base = bf16_bits(master).view(np.uint8)
    adam_like_step(master, 1e-6, rng)
    new = bf16_bits(master).view(np.uint8)
    xor = np.bitwise_xor(new, base)
    target = np.zeros_like(new)
    chunks = [(start, min(start + CHUNK, size)) for start in range(0, size, CHUNK)]
    compressor = zstandard.ZstdCompressor(level=1)
    decompressor = zstandard.ZstdDecompressor()
    frames = [compressor.compress(xor[start:end]) for start, end in chunks]

    def bare_decompress() -> None:
        for (start, end), frame in zip(chunks, frames):
            decompressor.stream_reader(frame).readinto(memoryview(target)[start:end])

    results = {}
    with ChunkPool(1) as pool:
        for name in args.codecs.split(","):
            codec = make_codec(name)
            encode_s, encoded = best_of(repeats, lambda codec=codec: codec.encode_many([EncodeItem(new, base, 2)], pool)[0])
            applied = np.zeros_like(new)
            # As the controller does: the base (the engine's bits) XOR the decoded delta into a staging buffer.
            decode_s, _ = best_of(repeats, lambda codec=codec, encoded=encoded, applied=applied: codec.decode_many(
                [DecodeItem(memoryview(encoded.payload), base, applied, 2)], pool))
            assert np.array_equal(applied, new), f"{name}: decode+apply is not bit-exact"
            results[name] = (encode_s, decode_s, size / len(encoded.payload))
    memcpy_s, _ = best_of(repeats, lambda: np.copyto(target, new))
    compress_s, _ = best_of(repeats, lambda: [compressor.compress(xor[start:end]) for start, end in chunks])
    decompress_s, _ = best_of(repeats, bare_decompress)

    def rate(seconds: float) -> str:
        return f"{size / seconds / 1e9:.2f}"

    rows = [["memcpy", rate(memcpy_s), "", "1.00", ""],
            ["bare zstd-1 compress of the XOR", rate(compress_s), "1.00", f"{memcpy_s / compress_s:.2f}", ""],
            ["bare zstd decompress (reused buffer)", rate(decompress_s), "1.00", f"{memcpy_s / decompress_s:.2f}", ""]]
    for name, (encode_s, decode_s, ratio) in results.items():
        rows.append([f"{name} encode", rate(encode_s), f"{compress_s / encode_s:.2f}", f"{memcpy_s / encode_s:.2f}",
                     f"{ratio:.1f}x"])
        rows.append([f"{name} decode+apply", rate(decode_s), f"{decompress_s / decode_s:.2f}",
                     f"{memcpy_s / decode_s:.2f}", f"{ratio:.1f}x"])
    report.table(["operation (one core)", "GB/s of model", "x bare zstd", "x memcpy", "delta ratio"], rows)
    report.say()
    report.say("Encode = XOR + transform + zstd + checksum of the new bits; decode+apply = zstd + inverse transform + XOR "
               "of the base into the result + checksum of the result. 'x bare zstd': fraction of bare zstd's speed on the "
               "same buffer (compress for encode, decompress for decode; target >= 0.70).")
    report.save(args.quick)


if __name__ == "__main__":
    main()
