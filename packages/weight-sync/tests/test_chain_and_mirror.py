"""A 500-version chain stays bit-exact; a node mirror fans one download out to several engines."""

from __future__ import annotations

import numpy as np
import pytest

from relayrl.core.store import open_store
from relayrl.weight_sync import Controller, NodeMirror, Publisher, StateDictAdapter, WeightBus, WeightSyncSection
from relayrl.weight_sync.testing.models import engine_equals, small_state, zero_engine
from relayrl.weight_sync.testing.synthetic import adam_like_step, bf16_bits, init_master


def test_500_version_chain_stays_bit_exact(tmp_path):
    """Adam-like bf16 updates (plus an fp32 tensor) for 500 versions, all deltas on one snapshot."""
    store = open_store(f"file://{tmp_path}/bus", fsync=False)
    rng = np.random.default_rng(0)
    master = init_master(120_000, seed=1)
    norm = rng.normal(1.0, 0.01, 257).astype(np.float32)
    trainer = {"w": bf16_bits(master), "norm": norm}
    publisher = Publisher(store, snapshot_every_versions=1000, keep_versions=0, background=False, threads=1)
    follower = StateDictAdapter({"w": np.zeros_like(trainer["w"]), "norm": np.zeros_like(norm)})
    controller = Controller(store, follower, threads=1, verify_after_apply=False)
    routes = []
    for version in range(1, 501):
        adam_like_step(master, 1e-5, rng)
        bf16_bits(master, out=trainer["w"])
        norm += np.float32(1e-4) * rng.standard_normal(norm.size, dtype=np.float32) * (rng.random(norm.size) < 0.1)
        publisher.publish(trainer, step=version)
        report = controller.poll_once()
        routes.append(report.route)
        assert np.array_equal(follower.tensors["w"], trainer["w"]), f"version {version}"
        assert np.array_equal(follower.tensors["norm"].view(np.uint32), norm.view(np.uint32)), f"version {version}"
    assert routes.count("delta") == 499
    # A new engine replays the whole chain: one snapshot plus 499 deltas, still bit-exact.
    fresh = StateDictAdapter({"w": np.zeros_like(trainer["w"]), "norm": np.zeros_like(norm)})
    report = Controller(store, fresh, threads=1).poll_once()
    assert (report.route, report.versions_decoded) == ("snapshot", 500)
    assert np.array_equal(fresh.tensors["w"], trainer["w"]) and np.array_equal(fresh.tensors["norm"], norm)
    publisher.close()


@pytest.mark.parametrize("remote_kind", ["file", "s3"])
def test_node_mirror_downloads_once_for_every_engine_on_the_node(tmp_path, remote_kind, request):
    remote = open_store(request.getfixturevalue("s3_url") if remote_kind == "s3" else f"file://{tmp_path}/remote")
    local = open_store(f"file://{tmp_path}/node-local")
    publisher = Publisher(remote, snapshot_every_versions=3, keep_versions=3)
    mirror = NodeMirror(remote, local, keep_versions=2)
    engines = [zero_engine() for _ in range(3)]
    controllers = [Controller(local, engine) for engine in engines]
    copied = []
    for version in range(1, 6):
        publisher.publish(small_state(version)).result()
        report = mirror.sync_once()
        copied.append(report.versions_copied)
        for controller, engine in zip(controllers, engines):
            controller.poll_once()
            assert engine.served_version == version and engine_equals(engine, small_state(version))
    assert copied == [[1], [2], [3], [4], [5]]          # each version crosses the network once
    assert mirror.sync_once().versions_copied == []
    assert WeightBus(local).committed_versions() == [4, 5]
    publisher.close()
    mirror.close()


def test_stage_url_points_controllers_at_the_node_mirror(tmp_path):
    remote = open_store(f"file://{tmp_path}/remote")
    section = WeightSyncSection(stage_url=f"file://{tmp_path}/shm")
    publisher = Publisher.from_config(remote, section)
    publisher.publish(small_state(1)).result()
    engine = zero_engine()
    controller = Controller.from_config(remote, engine, section)
    assert controller.poll_once() is None                 # nothing staged on the node yet
    NodeMirror.from_config(remote, section).sync_once()
    assert controller.poll_once().version == 1 and engine_equals(engine, small_state(1))
    publisher.close()


def test_the_mirror_command_copies_the_newest_version(tmp_path, capsys):
    from relayrl.weight_sync.mirror import main

    remote = open_store(f"file://{tmp_path}/remote")
    publisher = Publisher(remote, background=False)
    for seed in (1, 2):
        publisher.publish(small_state(seed)).result()
    assert main([f"file://{tmp_path}/remote", f"file://{tmp_path}/node", "--once"]) == 0
    assert "version 2" in capsys.readouterr().out
    assert WeightBus(open_store(f"file://{tmp_path}/node")).newest_version() == 2
    publisher.close()


def test_works_without_torch(tmp_path):
    """The package never imports torch for numpy tensors; torch is blocked in a subprocess to prove it."""
    import os
    import subprocess
    import sys

    probe = f"""
import sys
sys.modules["torch"] = None  # any import of torch now fails
from relayrl.core.store import open_store
from relayrl.weight_sync import Controller, Publisher
from relayrl.weight_sync.testing.models import engine_equals, small_state, zero_engine
store = open_store("file://{tmp_path}/bus")
publisher = Publisher(store)
engine = zero_engine()
for version in (1, 2):
    publisher.publish(small_state(version)).result()
    Controller(store, engine).poll_once()
assert engine_equals(engine, small_state(2))
publisher.close()
print("ok")
"""
    # Third-party plugins installed next to it may need torch; this checks weight-sync alone.
    env = dict(os.environ, RELAYRL_LOAD_PLUGINS="")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert result.stdout.strip() == "ok", result.stderr
