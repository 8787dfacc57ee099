"""Benchmark 4: bootstrapping a new engine from a snapshot + 24 deltas vs from one full snapshot.

A bf16 model (default 128M parameters = 256 MiB) trained for 24 Adam-like steps at lr 1e-6 is
published as a snapshot followed by 24 deltas. A fresh engine's controller then bootstraps to the
newest version (fetch the snapshot and 24 deltas, decode, check every version's bits, apply), and,
in the same run, another fresh engine loads the same weights published as a single full snapshot.

    python benchmarks/weight_sync/bootstrap.py            # 128M parameters
    python benchmarks/weight_sync/bootstrap.py --quick    # 4M parameters, for CI
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
from common import MIB, Report, machine

from relayrl.core.store import open_store
from relayrl.weight_sync import Controller, Publisher, StateDictAdapter
from relayrl.weight_sync.testing.synthetic import adam_like_step, bf16_bits, init_master

DELTAS = 24
TENSORS = 16


def split(bits: np.ndarray) -> dict[str, np.ndarray]:
    return {f"layers.{index}.weight": part for index, part in enumerate(np.array_split(bits, TENSORS))}


def bootstrap(url: str, prefix: str, shapes: dict[str, np.ndarray]) -> tuple[object, dict[str, np.ndarray]]:
    engine_tensors = {name: np.zeros_like(bits) for name, bits in shapes.items()}
    controller = Controller(open_store(url), StateDictAdapter(engine_tensors), prefix=prefix)
    report = controller.poll_once()
    controller.close()
    return report, engine_tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4M parameters (a CI smoke run)")
    parser.add_argument("--params", type=int, default=0, help="parameters (default 128M)")
    args = parser.parse_args()
    params = args.params or (4 * MIB if args.quick else 128 * MIB)
    print(machine())
    report = Report("bootstrap")
    report.say(f"{params / 1e6:.0f}M bf16 parameters ({2 * params / MIB:.0f} MiB), {DELTAS} Adam-like steps at lr 1e-6, "
               "local files: a new engine bootstrapping from a snapshot and every delta after it, against one "
               "snapshot of the same version:")
    report.say()
    master = init_master(params, seed=0)
    rng = np.random.default_rng(1)
    bits = bf16_bits(master)
    with tempfile.TemporaryDirectory(prefix="relayrl-bootstrap-") as directory:
        url = f"file://{directory}"
        store = open_store(url)
        chain = Publisher(store, prefix="chain", snapshot_every_versions=1000, keep_versions=0)
        chain.publish(split(bits)).result()
        for _ in range(DELTAS):
            adam_like_step(master, 1e-6, rng)
            bf16_bits(master, out=bits)
            chain.publish(split(bits)).result()
        chain.close()
        single = Publisher(store, prefix="single", keep_versions=0)
        single.publish(split(bits)).result()
        single.close()
        expected = split(bits)
        replay, replay_tensors = bootstrap(url, "chain", expected)
        full, full_tensors = bootstrap(url, "single", expected)
        for tensors in (replay_tensors, full_tensors):
            assert all(np.array_equal(tensors[name], value) for name, value in expected.items()), "wrong bits"
    rows = []
    for label, applied in ((f"snapshot + {DELTAS} deltas", replay), ("one full snapshot", full)):
        rows.append([label, applied.versions_decoded, f"{applied.bytes_fetched / MIB:.1f}", f"{applied.fetch_s:.2f}",
                     f"{applied.decode_s:.2f}", f"{applied.pause_s:.2f}", f"{applied.total_s:.2f}",
                     f"{applied.total_s / full.total_s:.2f}x", f"{applied.bytes_fetched / full.bytes_fetched:.2f}x"])
    report.table(["bootstrap from", "versions", "fetched MiB", "fetch s", "decode+verify s", "pause s", "total s",
                 "time vs snapshot", "bytes vs snapshot"], rows)
    report.save(args.quick)


if __name__ == "__main__":
    main()
