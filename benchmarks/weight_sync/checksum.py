"""Why weight sync hashes with XXH3: one core's speed of the candidate checksums on the same buffer.

Hashes a 256 MiB buffer of bf16 bits on one core (best of N) with what the manifests use (XXH3-64
of every 1 MiB block, rolled up: :func:`relayrl.weight_sync.checksum.tensor_checksum`), plain
XXH3-64 of the whole buffer, ``zlib.crc32`` (what the object store's framing uses) and blake2b; and,
for scale, a copy into reused memory against a copy into freshly allocated memory (first touch:
why the codecs reuse their scratch buffers). Prints GB/s and each one's speed relative to the
manifest checksum.

    python benchmarks/weight_sync/checksum.py            # 256 MiB
    python benchmarks/weight_sync/checksum.py --quick    # 16 MiB, for CI
"""

from __future__ import annotations

import argparse
import hashlib
import os
import zlib

import numpy as np
import xxhash
from common import MIB, Report, best_of, machine

from relayrl.weight_sync.checksum import tensor_checksum
from relayrl.weight_sync.testing.synthetic import bf16_bits, init_master


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB buffer, one repeat (a CI smoke run)")
    args = parser.parse_args()
    size = 16 * MIB if args.quick else 256 * MIB
    repeats = 1 if args.quick else 5
    print(machine())
    report = Report("checksum")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # one core: per-core speeds
    bits = bf16_bits(init_master(size // 2, seed=0)).view(np.uint8)
    reused = np.empty_like(bits)
    candidates = {
        "manifest checksum (XXH3-64 per 1 MiB block, rolled up)": lambda: tensor_checksum(bits),
        "XXH3-64 of the whole buffer": lambda: xxhash.xxh3_64_intdigest(bits),
        "zlib.crc32 (the store's framing)": lambda: zlib.crc32(bits),
        "blake2b": lambda: hashlib.blake2b(bits).digest(),
        "copy into reused memory": lambda: np.copyto(reused, bits),
        "copy into fresh memory (first touch)": lambda: bits.copy(),
    }
    seconds = {name: best_of(repeats, function)[0] for name, function in candidates.items()}
    baseline = seconds[next(iter(candidates))]
    report.say(f"A {size // MIB} MiB buffer of bf16 bits on one core, best of {repeats}:")
    report.say()
    report.table(["operation (one core)", "GB/s", "time vs manifest checksum"],
                 [[name, f"{size / value / 1e9:.2f}", f"{value / baseline:.2f}x"] for name, value in seconds.items()])
    report.save(args.quick)


if __name__ == "__main__":
    main()
