"""Benchmark 3: publish -> applied on an engine, delta path vs shipping full safetensors, same store.

A bf16 model (default 1B parameters = 2 GiB, in 64 tensors) is published once as a snapshot and
applied on an engine (set-up, untimed). Then ~1% of the values move by one ulp (an RL step) and:

* delta: ``Publisher.publish`` -> committed (XOR+zstd delta, objects then manifest) ->
  ``Controller.poll_once`` -> fetched, decoded, verified, paused, applied, verified, resumed;
* full: the same weights serialised safetensors-style (JSON header + raw bytes) -> one object put
  into the same store -> get -> parsed -> copied into the engine's tensors.

Both run through local files and through an S3 server on loopback (moto's server mode). The engine
must hold the new bits exactly after each path.

    python benchmarks/weight_sync/end_to_end.py                 # 1B parameters, file and s3
    python benchmarks/weight_sync/end_to_end.py --quick         # 16M parameters, for CI
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import tempfile
import time

import numpy as np
from common import GIB, MIB, Report, bf16_model, machine, nudge

from relayrl.core.store import open_store
from relayrl.weight_sync import Controller, Publisher, StateDictAdapter


def safetensors_bytes(model: dict[str, np.ndarray]) -> bytes:
    """The safetensors layout: u64 header length, JSON header, then the tensors' raw bytes."""
    header, offset = {}, 0
    for name, bits in model.items():
        header[name] = {"dtype": "BF16", "shape": [bits.size], "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    encoded = json.dumps(header).encode()
    return b"".join([len(encoded).to_bytes(8, "little"), encoded, *[bits.view(np.uint8) for bits in model.values()]])


def load_safetensors_into(blob: memoryview, engine: dict[str, np.ndarray]) -> None:
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(bytes(blob[8:8 + length]))
    base = 8 + length
    for name, info in header.items():
        start, end = info["data_offsets"]
        np.copyto(engine[name].view(np.uint8), np.frombuffer(blob[base + start:base + end], np.uint8))


def run(store_url: str, model: dict[str, np.ndarray], fraction: float, seed: int) -> dict[str, float]:
    store = open_store(store_url)
    engine_tensors = {name: np.zeros_like(bits) for name, bits in model.items()}
    engine = StateDictAdapter(engine_tensors)
    publisher = Publisher(store, keep_versions=2, snapshot_every_versions=1000)
    controller = Controller(store, engine)
    # Set-up, untimed: a snapshot and one empty delta published and applied, so that the publisher's
    # two CPU buffers and the controller's staging are touched (steady state; first-touch of fresh
    # memory runs at ~0.4 GB/s here).
    for _ in range(2):
        publisher.publish(model).result()
        controller.poll_once()
    nudge(model, fraction, seed)

    start = time.perf_counter()
    future = publisher.publish(model)
    blocked_s = time.perf_counter() - start
    published = future.result()
    report = controller.poll_once()
    delta_s = time.perf_counter() - start
    assert all(np.array_equal(engine_tensors[name], bits) for name, bits in model.items()), "delta path: wrong bits"
    publisher.close()
    controller.close()
    del publisher, controller, engine   # frees the publisher's two CPU copies and the staging (6 GiB at 1B)
    gc.collect()

    start = time.perf_counter()
    blob = safetensors_bytes(model)
    store.put("full/model.safetensors", blob)
    del blob
    load_safetensors_into(store.get_buffer("full/model.safetensors"), engine_tensors)
    full_s = time.perf_counter() - start
    assert all(np.array_equal(engine_tensors[name], bits) for name, bits in model.items()), "full path: wrong bits"
    return {"delta_s": delta_s, "full_s": full_s, "blocked_s": blocked_s, "encode_s": published.encode_s,
            "upload_s": published.upload_s + published.commit_s, "fetch_s": report.fetch_s,
            "decode_s": report.decode_s, "pause_s": report.pause_s, "apply_s": report.apply_s,
            "verify_s": report.verify_after_apply_s, "delta_bytes": published.stored_bytes,
            "full_bytes": sum(bits.nbytes for bits in model.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16M parameters (a CI smoke run)")
    parser.add_argument("--params", type=int, default=0, help="parameters (default 1B = 2 GiB of bf16)")
    parser.add_argument("--stores", default="file,s3", help="comma-separated: file, s3")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of values changed per step")
    args = parser.parse_args()
    params = args.params or (16 * MIB if args.quick else 1 << 30)
    print(machine())
    report = Report("end_to_end")
    report.say(f"{params / 1e9:.2f}B bf16 parameters ({2 * params / GIB:.2f} GiB in 64 tensors), {100 * args.changed:g}% "
               "of values moved by one ulp (synthetic: the best case; real updates are in section 5); the delta path "
               "against shipping the same weights as safetensors bytes through the same store:")
    report.say()
    model = bf16_model(params, 64, seed=0)
    rows = []
    for kind in args.stores.split(","):
        with contextlib.ExitStack() as stack:
            if kind == "s3":
                from relayrl.core.testing import S3Server

                server = stack.enter_context(S3Server())
                stack.enter_context(server.environment())
                url = server.create_bucket("bench") + "/run"
            else:
                url = "file://" + stack.enter_context(tempfile.TemporaryDirectory(prefix="relayrl-bench-"))
            result = run(url, model, args.changed, seed=len(rows) + 1)
        rows.append([kind, f"{result['full_s']:.2f}", f"{result['delta_s']:.2f}", f"{result['full_s'] / result['delta_s']:.1f}x",
                     f"{result['full_bytes'] / MIB:.0f}", f"{result['delta_bytes'] / MIB:.1f}",
                     f"{result['full_bytes'] / result['delta_bytes']:.0f}x", f"{result['blocked_s']:.2f}",
                     f"{result['encode_s']:.2f}", f"{result['upload_s']:.2f}", f"{result['fetch_s']:.2f}",
                     f"{result['decode_s']:.2f}", f"{result['pause_s']:.2f}", f"{result['apply_s']:.2f}",
                     f"{result['verify_s']:.2f}"])
    report.table(["store", "full s", "delta s", "speed-up", "full MiB", "delta MiB", "fewer bytes", "trainer blocked s",
                 "encode s", "upload+commit s", "fetch s", "decode+verify s", "pause s", "apply s",
                 "verify after s"], rows)
    report.say()
    report.say("Full: safetensors bytes put into and read back from the same store, copied into the engine. Delta: "
               "publish -> committed -> controller fetch, decode, verify, pause, apply, verify, resume. "
               "Pause includes apply and the after-apply verification.")
    report.save(args.quick)


if __name__ == "__main__":
    main()
