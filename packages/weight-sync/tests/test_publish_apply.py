"""Publisher and Controller through real stores: routes, fallbacks, sharding, retention, timing."""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import pytest

from relayrl.core import codec
from relayrl.core.config import load_config
from relayrl.core.store import open_store
from relayrl.core.wire import WeightManifest
from relayrl.weight_sync import (
    BitMismatch,
    Controller,
    CorruptManifest,
    NodeMirror,
    Publisher,
    StateDictAdapter,
    VersionUnavailable,
    WeightBus,
    WeightSyncSection,
    apply_retention,
    needed_versions,
)
from relayrl.weight_sync.codecs import DEFAULT_DELTA_CODEC
from relayrl.weight_sync.errors import ConcurrentWriter, WeightSyncError
from relayrl.weight_sync.testing.models import SMALL_SIZES as SIZES
from relayrl.weight_sync.testing.models import engine_equals
from relayrl.weight_sync.testing.models import small_state as state
from relayrl.weight_sync.testing.models import zero_engine as fresh_engine


@pytest.fixture
def store(tmp_path):
    return open_store(f"file://{tmp_path}/bus")


def publish(publisher: Publisher, *versions: int) -> None:
    for version in versions:
        assert publisher.next_version == version
        publisher.publish(state(version), step=version * 10).result()


def test_delta_onto_the_exact_parent_with_every_phase_timed(store):
    publisher = Publisher(store, snapshot_every_versions=10, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publish(publisher, 1)
    first = controller.poll_once()
    assert first.route == "snapshot" and engine.served_version == 1 and engine_equals(engine, state(1))
    publish(publisher, 2)
    report = controller.poll_once()
    assert (report.route, report.previous, report.version, report.versions_decoded) == ("delta", 1, 2, 1)
    assert engine_equals(engine, state(2)) and engine.pauses == 2
    assert report.bytes_fetched * 5 < first.bytes_fetched
    for phase in ("fetch_s", "decode_s", "pause_s", "apply_s", "verify_after_apply_s", "total_s"):
        assert getattr(report, phase) > 0, phase
    assert controller.poll_once() is None
    manifest = WeightBus(store).read_manifest(2)
    assert (manifest.kind, manifest.parent, manifest.snapshot, manifest.step) == ("delta", 1, 1, 20)
    publisher.close()


def test_replay_when_behind_crossing_a_snapshot_through_its_bridge(store):
    publisher = Publisher(store, snapshot_every_versions=6, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publish(publisher, 1, 2)
    controller.poll_once()
    publish(publisher, 3, 4, 5)
    report = controller.poll_once()
    assert (report.route, report.versions_decoded) == ("replay", 3) and engine_equals(engine, state(5))
    publish(publisher, 6, 7, 8, 9, 10, 11, 12)   # 7 is a snapshot with a bridge delta from 6
    bus = WeightBus(store)
    assert bus.read_manifest(7).kind == "full" and bus.read_bridge(bus.read_manifest(7)).parent == 6
    report = controller.poll_once()
    assert (report.route, report.versions_decoded) == ("replay", 7) and engine_equals(engine, state(12))
    assert report.bytes_fetched < bus.read_manifest(7).tensors[1].length
    publisher.close()


def test_jump_to_the_snapshot_when_it_is_fewer_bytes_than_replay(store):
    def noise(version):  # every bit changes: deltas cost as much as a snapshot
        rng = np.random.default_rng(version)
        return {name: rng.integers(0, 1 << 16, size, dtype=np.uint16) for name, size in SIZES.items()}

    publisher = Publisher(store, snapshot_every_versions=4, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publisher.publish(noise(1)).result()
    controller.poll_once()
    for version in range(2, 7):                   # 5 is a snapshot (with a bridge); replay 2..6 would be 5 deltas
        publisher.publish(noise(version)).result()
    report = controller.poll_once()
    assert (report.route, report.versions_decoded) == ("snapshot", 2)
    assert engine_equals(engine, noise(6))
    publisher.close()


def test_without_bridges_an_engine_behind_a_snapshot_loads_it(store):
    publisher = Publisher(store, snapshot_every_versions=3, keep_versions=0, bridge_deltas=False)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publish(publisher, 1, 2)
    controller.poll_once()
    publish(publisher, 3, 4, 5)
    report = controller.poll_once()
    assert (report.route, report.versions_decoded) == ("snapshot", 2) and engine_equals(engine, state(5))
    publisher.close()


def test_a_new_engine_bootstraps_from_the_snapshot_and_replays_deltas(store):
    publisher = Publisher(store, snapshot_every_versions=50, keep_versions=0)
    publish(publisher, *range(1, 9))
    engine = fresh_engine()
    report = Controller(store, engine).poll_once()
    assert (report.route, report.versions_decoded, report.previous) == ("snapshot", 8, None)
    assert engine_equals(engine, state(8))
    publisher.close()


def test_an_engine_whose_bits_are_not_its_version_falls_back_to_the_snapshot(store):
    publisher = Publisher(store, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publish(publisher, 1)
    controller.poll_once()
    engine.tensors["mlp"][123] ^= 1       # the engine's bits no longer are version 1
    publish(publisher, 2)
    report = controller.poll_once()
    assert report.retried and report.route == "snapshot" and engine_equals(engine, state(2))


def test_xor_apply_mode_and_cache_reset(store):
    publisher = Publisher(store, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine, apply_mode="xor", reset_caches_on_apply=True)
    publish(publisher, 1, 2)
    controller.poll_once()
    publish(publisher, 3)
    assert controller.poll_once().route == "delta"
    assert engine_equals(engine, state(3)) and engine.cache_resets == 2


@pytest.mark.parametrize("apply_mode", ["copy", "xor"])
def test_tied_weights_take_each_version_once_in_either_apply_mode(store, apply_mode):
    """An engine whose two tensors share one memory (tied embedding and LM head, as many LLMs have):
    XOR-ing the same delta into that memory once per name would restore the old bits."""
    import torch

    def tied_state(seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        embed = torch.randn(32, 16, generator=generator)
        return {"embed": embed, "lm_head": embed, "mlp": torch.randn(16, 16, generator=generator)}

    engine_state = tied_state(0)  # the engine's model: lm_head is embed
    assert engine_state["lm_head"].data_ptr() == engine_state["embed"].data_ptr()
    engine = StateDictAdapter(engine_state)
    controller = Controller(store, engine, apply_mode=apply_mode)
    publisher = Publisher(store, keep_versions=0, background=False)
    for version in (1, 2, 3):  # a snapshot, then deltas
        published = tied_state(version)
        publisher.publish({name: tensor.clone() for name, tensor in published.items()}).result()
        controller.poll_once()
        for name, tensor in published.items():
            assert torch.equal(engine_state[name], tensor), (version, name)
    assert controller.reports[-1].route == "delta"
    publisher.close()


class CorruptingEngine(StateDictAdapter):
    """Flips one bit of every apply, as faulty memory or a buggy engine would."""

    def apply_tensors(self, tensors):
        super().apply_tensors(tensors)
        self.tensors["embed"][0] ^= 1


def test_a_mismatch_after_apply_is_an_error_and_leaves_the_engine_paused_with_its_version_unknown(store):
    publisher = Publisher(store, keep_versions=0)
    engine = CorruptingEngine({name: np.zeros(size, np.uint16) for name, size in SIZES.items()})
    publish(publisher, 1)
    controller = Controller(store, engine)
    with pytest.raises(BitMismatch, match="version 1"):
        controller.poll_once()
    assert engine.served_version is None and engine._paused and controller.held_paused


class FailingEngine(StateDictAdapter):
    """Raises partway through an apply (an engine's loader failing, a device error), after writing some tensors."""

    fail_after: int | None = None

    def _partial(self, apply, items):
        for index, (name, bits) in enumerate(items.items()):
            if self.fail_after is not None and index == self.fail_after:
                raise RuntimeError(f"loader failed at {name}")
            apply({name: bits})

    def apply_tensors(self, tensors):
        self._partial(super().apply_tensors, tensors)

    def apply_xor(self, deltas):
        self._partial(super().apply_xor, deltas)


@pytest.mark.parametrize("apply_mode", ["copy", "xor"])
def test_an_apply_that_raises_partway_never_serves_mixed_bits_and_heals_from_a_snapshot(store, apply_mode):
    publisher = Publisher(store, keep_versions=0)
    engine = FailingEngine({name: np.zeros(size, np.uint16) for name, size in SIZES.items()})
    controller = Controller(store, engine, apply_mode=apply_mode)
    publish(publisher, 1)
    controller.poll_once()
    publish(publisher, 2)
    engine.fail_after = 1
    with pytest.raises(WeightSyncError, match="applying version 2 failed .*loader failed.*stays paused"):
        controller.poll_once()
    # Half old, half new: the engine must not serve it under version 1's number, nor at all.
    assert not engine_equals(engine, state(1)) and not engine_equals(engine, state(2))
    assert engine.served_version is None and engine._paused and controller.held_paused
    with pytest.raises(WeightSyncError, match="failed"):  # still failing: still paused, still unknown
        controller.poll_once()
    assert engine._paused and engine.served_version is None
    engine.fail_after = None
    report = controller.poll_once()
    assert (report.route, report.previous, report.version) == ("snapshot", None, 2)
    assert engine_equals(engine, state(2)) and engine.served_version == 2
    assert not engine._paused and not controller.held_paused
    publish(publisher, 3)  # back to deltas
    assert controller.poll_once().route == "delta" and engine_equals(engine, state(3))
    publisher.close()


def test_an_engine_with_other_tensors_is_refused_by_name(store):
    publisher = Publisher(store, keep_versions=0)
    publish(publisher, 1)
    engine = StateDictAdapter({"embed": np.zeros(SIZES["embed"], np.uint16)})
    with pytest.raises(WeightSyncError, match="version only: \\['mlp', 'norm'\\]"):
        Controller(store, engine).poll_once()


def test_sharded_version_is_invisible_until_every_rank_commits(store):
    names = list(SIZES)
    ranks = [Publisher(store, rank=rank, world_size=2, first_version=1, keep_versions=0) for rank in range(2)]
    owned = [{name: value for name, value in state(1).items() if names.index(name) % 2 == rank} for rank in range(2)]
    assert ranks[0].publish(owned[0]).result().committed is False
    bus = WeightBus(store)
    assert bus.newest_version() is None and Controller(store, fresh_engine()).poll_once() is None
    assert ranks[1].publish(owned[1]).result().committed is True
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine_equals(engine, state(1)) and bus.newest_version() == 1
    for rank in ranks:
        rank.close()


def test_retention_keeps_latest_needed_bases_and_in_flight_objects(store):
    publisher = Publisher(store, snapshot_every_versions=4, keep_versions=0)
    publish(publisher, *range(1, 11))                     # snapshots 1, 5, 9
    bus = WeightBus(store)
    in_flight = bus.object_key(11, "inflight", 0, 0)
    store.put(in_flight, b"half of version 11")           # a publisher still uploading
    dead = bus.object_key(4, "deadattempt", 0, 0)
    store.put(dead, b"a killed attempt at version 4")
    bridge_of_5 = bus.read_manifest(5).metadata["bridge"]
    bridge_of_9 = bus.read_manifest(9).metadata["bridge"]
    deleted = apply_retention(bus, keep_versions=3)       # keep 8, 9, 10: chain of 8 needs 5..8
    assert deleted == [1, 2, 3, 4] and bus.committed_versions() == [5, 6, 7, 8, 9, 10]
    assert store.exists(in_flight) and not store.exists(dead)
    assert store.exists(bridge_of_5) and store.exists(bridge_of_9)
    assert needed_versions(bus, [8]) == {5, 6, 7, 8}
    apply_retention(bus, keep_versions=1)                 # keep 10: needs 9, 10 (9 is a snapshot)
    assert bus.committed_versions() == [9, 10] and not store.exists(bridge_of_5) and store.exists(bridge_of_9)
    for version in bus.committed_versions():
        for entry in bus.read_manifest(version).tensors:
            assert store.exists(entry.object_key)
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine_equals(engine, state(10))
    publisher.close()


def test_keep_every_keeps_version_one_and_every_nth_after_it_with_their_bases(store):
    publisher = Publisher(store, snapshot_every_versions=4, keep_versions=2, keep_every=5, background=False)
    publish(publisher, *range(1, 13))  # snapshots 1, 5, 9; milestones 1, 6, 11
    bus = WeightBus(store)
    # 11, 12 newest; milestone 6 needs its chain from snapshot 5; 11 needs 9, 10.
    assert bus.committed_versions() == [1, 5, 6, 9, 10, 11, 12]
    for version in (1, 6):  # a kept milestone still rebuilds bit for bit
        engine = fresh_engine()
        Controller(store, engine).update_to(version)
        assert engine_equals(engine, state(version))
    publisher.close()
    without = Publisher(open_store(f"{store.url}-plain"), snapshot_every_versions=4, keep_versions=2, background=False)
    publish(without, *range(1, 13))
    assert WeightBus(without.bus.store).committed_versions() == [9, 10, 11, 12]
    without.close()


@pytest.mark.parametrize("damage", ["torn", "flipped", "not-utf8", "not-a-number", "empty"])
def test_a_damaged_latest_pointer_is_only_a_missing_hint_and_the_next_publish_rewrites_it(store, tmp_path, damage):
    """``latest`` is a hint: damaged, readers fall back to the listing, retention goes on, and the next
    publish (even a restarted publisher's) writes a good one."""
    publisher = Publisher(store, snapshot_every_versions=3, keep_versions=2, background=False)
    publish(publisher, 1, 2, 3)
    bus = WeightBus(store)
    path = tmp_path / "bus" / "weights" / "latest"
    framed = path.read_bytes()
    if damage == "torn":
        path.write_bytes(framed[:len(framed) // 2])
    elif damage == "flipped":
        path.write_bytes(bytes([framed[0] ^ 0x01]) + framed[1:])  # a payload bit: the checksum fails
    else:
        store.put(bus.key("latest"), {"not-utf8": b"\xff\xfe3", "not-a-number": b"three", "empty": b""}[damage])
    assert bus.read_latest_pointer() is None
    assert bus.newest_version() == 3
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine_equals(engine, state(3))
    restarted = Publisher(store, snapshot_every_versions=3, keep_versions=2, background=False)
    publish(restarted, 4, 5)
    assert bus.read_latest_pointer() == 5 and bus.committed_versions() == [4, 5]  # retention went on
    publisher.close()
    restarted.close()


@pytest.mark.parametrize("damage", ["undecodable", "checksum"])
@pytest.mark.parametrize("what", ["delta manifest", "bridge"])
def test_a_follower_routes_around_an_unreadable_manifest_or_bridge_to_the_snapshot(store, tmp_path, damage, what):
    """A manifest or bridge whose bytes pass the store's checksum but do not decode (or fail it) is an
    unavailable route, never an error that keeps a follower behind a newer snapshot."""
    publisher = Publisher(store, snapshot_every_versions=3, keep_versions=0, background=False)
    publish(publisher, 1)
    follower = fresh_engine()
    controller = Controller(store, follower)
    controller.update_to(1)
    publish(publisher, 2, 3, 4, 5)  # 4 is a snapshot with a bridge from 3
    bus = WeightBus(store)
    key = bus.manifest_key(2) if what == "delta manifest" else bus.read_manifest(4).metadata["bridge"]
    if damage == "undecodable":
        store.put(key, b"\x93not a manifest")
    else:
        path = tmp_path / "bus" / key
        framed = path.read_bytes()
        path.write_bytes(bytes([framed[0] ^ 0x01]) + framed[1:])
    report = controller.poll_once()
    assert report is not None and report.version == 5 and report.route == "snapshot"
    assert engine_equals(follower, state(5))
    publisher.close()


def test_an_ambiguous_manifest_write_does_not_wedge_the_publisher(store):
    """The manifest write lands but the client sees an error (a connection reset after the write): the
    next publish finds its own earlier attempt committed, keeps it, and publishes as the next version,
    instead of failing for good with "committed by another publisher"."""
    from relayrl.core.errors import StoreError

    bus = WeightBus(store)
    real_put, tripped = store.put, []

    def put_then_fail_once(key, data, **options):
        result = real_put(key, data, **options)
        if key == bus.manifest_key(2) and not tripped:
            tripped.append(key)
            raise StoreError("connection reset after the write landed")
        return result

    store.put = put_then_fail_once
    publisher = Publisher(store, snapshot_every_versions=50, keep_versions=0)
    publish(publisher, 1)
    with pytest.raises(StoreError, match="connection reset"):
        publisher.publish(state(2), step=20).result()
    assert bus.exists(2) and publisher.next_version == 2  # committed, though the publisher could not know
    report = publisher.publish(state(3), step=30).result()
    assert report.version == 3 and report.kind == "full" and publisher.next_version == 4
    report = publisher.publish(state(4), step=40).result()
    assert report.version == 4 and report.kind == "delta"
    for version in (2, 3, 4):  # the earlier attempt's version 2 holds the bits it was published with
        engine = fresh_engine()
        Controller(store, engine).update_to(version)
        assert engine_equals(engine, state(version))
    publisher.close()
    # A manifest of an attempt that is not this publisher's is still another writer: refused.
    other = Publisher(store, keep_versions=0, first_version=4)
    other.publish(state(4), step=40)
    with pytest.raises(ConcurrentWriter, match="committed by another publisher"):
        other.close()  # waits for the publish, and re-raises its error
    # Publishing on does not log it and retry forever: the next publish raises it.
    third = Publisher(store, keep_versions=0, first_version=4)
    third.publish(state(4), step=40)
    with pytest.raises(ConcurrentWriter):
        third.publish(state(5), step=50)
    third.close()


def test_a_long_lived_controller_keeps_a_bounded_number_of_manifests(store, monkeypatch):
    from relayrl.weight_sync import layout

    monkeypatch.setattr(layout, "CACHED_MANIFESTS", 5)
    publisher = Publisher(store, snapshot_every_versions=3, keep_versions=0, background=False)
    engine = fresh_engine()
    controller = Controller(store, engine)
    for version in range(1, 21):
        publish(publisher, version)
        controller.poll_once()
        assert len(controller.bus._manifests) <= 5 and len(controller.bus._bridges) <= 5
    assert engine_equals(engine, state(20))
    publisher.close()


def test_retention_leaves_no_empty_directories_and_sweeps_dead_writers_temporaries(store, tmp_path):
    import os
    import time

    from relayrl.core.store.base import TEMP_MARKER

    root = tmp_path / "bus" / "weights"
    publisher = Publisher(store, snapshot_every_versions=3, keep_versions=2, background=False)
    publish(publisher, 1, 2)
    dead = root / "objects" / "0000000002" / f".part{TEMP_MARKER}killed"
    dead.write_bytes(b"half an object")
    os.utime(dead, (time.time() - 7200, time.time() - 7200))  # a writer killed two hours ago
    publish(publisher, 3, 4, 5, 6)
    assert not dead.exists()
    kept = {int(path.name) for path in (root / "objects").iterdir()}
    assert kept <= set(WeightBus(store).committed_versions()) and all(any(path.iterdir())
                                                                     for path in (root / "objects").iterdir())
    publisher.close()


def test_a_lagging_latest_pointer_is_probed_past(store):
    publisher = Publisher(store, keep_versions=0)
    publish(publisher, 1, 2)
    bus = WeightBus(store)
    store.put(bus.key("latest"), b"1")                    # killed between manifest 2 and the pointer
    assert bus.newest_version() == 2
    with pytest.raises(WeightSyncError, match="uncommitted version 7"):
        bus.write_latest_pointer(7)


def test_a_restarted_publisher_continues_with_a_snapshot(store):
    publish(Publisher(store, keep_versions=0), 1, 2, 3)
    restarted = Publisher(store, keep_versions=0)
    publish(restarted, 4, 5)
    bus = WeightBus(store)
    assert [bus.read_manifest(v).kind for v in range(1, 6)] == ["full", "delta", "delta", "full", "delta"]


def test_publish_blocks_only_for_the_copy(store):
    publisher = Publisher(store, keep_versions=0)
    source = state(1)
    future = publisher.publish(source)
    for value in source.values():
        value[:] = 0                                       # the trainer moves on and overwrites its weights
    future.result()
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine_equals(engine, state(1))


def test_torch_module_round_trip():
    torch = pytest.importorskip("torch", reason="torch is optional; this test covers nn.Module engines")
    import tempfile

    store = open_store(tempfile.mkdtemp())
    torch.manual_seed(0)
    trainer = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128)).to(torch.bfloat16)
    served = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128)).to(torch.bfloat16)
    publisher = Publisher(store, keep_versions=0)
    controller = Controller(store, StateDictAdapter(served))
    optimizer = torch.optim.Adam(trainer.parameters(), lr=1e-3)
    for step in range(3):
        trainer(torch.randn(8, 64, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        publisher.publish(trainer.state_dict(), step=step).result()
        controller.poll_once()
        for (name, expected), actual in zip(trainer.state_dict().items(), served.state_dict().values()):
            assert torch.equal(expected.view(torch.int16), actual.view(torch.int16)), name
    publisher.close()


def test_a_float32_trainer_publishes_bfloat16_that_a_bfloat16_engine_applies_bit_exactly():
    """Low-precision rollouts: the engine's representation is what crosses the bus, deltas included."""
    torch = pytest.importorskip("torch", reason="torch is optional; this test covers nn.Module engines")
    import tempfile

    store = open_store(tempfile.mkdtemp())
    torch.manual_seed(0)
    trainer = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128))
    served = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128)).to(torch.bfloat16)
    publisher = Publisher(store, keep_versions=0, publish_dtype="bfloat16", snapshot_every_versions=10)
    controller = Controller(store, StateDictAdapter(served))
    optimizer = torch.optim.Adam(trainer.parameters(), lr=1e-3)
    for step in range(3):
        trainer(torch.randn(8, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        publisher.publish(trainer.state_dict(), step=step).result()
        controller.poll_once()
        assert controller.engine.served_version == step + 1
        for (name, master), actual in zip(trainer.state_dict().items(), served.state_dict().values()):
            assert master.dtype == torch.float32  # the trainer keeps its own precision
            assert torch.equal(master.to(torch.bfloat16).view(torch.int16), actual.view(torch.int16)), name
    manifests = [WeightBus(store).read_manifest(version) for version in (1, 2, 3)]
    assert [manifest.kind for manifest in manifests] == ["full", "delta", "delta"]
    assert {entry.dtype for manifest in manifests for entry in manifest.tensors} == {"bfloat16"}
    publisher.close()
    with pytest.raises(WeightSyncError, match="publish_dtype 'int8'"):
        Publisher(store, publish_dtype="int8")


def test_config_section_is_registered_and_configures_both_sides(store, isolated_plugins):
    config = load_config({"weight_sync": {"snapshot_every_versions": 3, "delta_codec": "xor-sparse-zstd",
                                          "apply_mode": "xor"}})
    section = config.weight_sync
    assert isinstance(section, WeightSyncSection) and section.keep_versions == 4
    assert WeightSyncSection().delta_codec == DEFAULT_DELTA_CODEC == Publisher(store).delta_codec.name
    publisher = Publisher.from_config(store, section)
    assert publisher.delta_codec.name == "xor-sparse-zstd" and publisher.snapshot_every_versions == 3
    engine = fresh_engine()
    controller = Controller.from_config(store, engine, section)
    publish(publisher, 1, 2)
    controller.poll_once()
    assert engine_equals(engine, state(2)) and controller.apply_mode == "xor"
    publisher.close()


def test_s3_publish_and_apply(s3_url):
    store = open_store(s3_url)
    publisher = Publisher(store, keep_versions=2, snapshot_every_versions=3)
    engine = fresh_engine()
    controller = Controller(store, engine)
    for version in range(1, 6):
        publish(publisher, version)
        controller.poll_once()
        assert engine_equals(engine, state(version))
    assert WeightBus(store).committed_versions() == [4, 5]
    publisher.close()


def test_a_failed_publish_is_retried_under_the_same_version_as_a_delta(tmp_path):
    from relayrl.core.errors import StoreError
    from relayrl.core.store import LocalStore

    class FlakyStore(LocalStore):
        """Fails the next object upload, as a store outage would."""

        fail_next = False

        def put(self, key, data, *, if_absent=False):
            if self.fail_next and "/objects/" in key:
                FlakyStore.fail_next = False
                raise StoreError(f"writing object {key} failed: injected outage")
            return super().put(key, data, if_absent=if_absent)

    store = FlakyStore(f"file://{tmp_path}/bus")
    publisher = Publisher(store, keep_versions=0)
    publish(publisher, 1)
    FlakyStore.fail_next = True
    assert not publisher.behind()
    with pytest.raises(StoreError, match="injected outage"):
        publisher.publish(state(2)).result()
    assert publisher.next_version == 2
    assert publisher.behind() and publisher.failed_version == 2  # a starved trainer publishes again
    publish(publisher, 2, 3)
    assert not publisher.behind() and publisher.failed_version is None
    bus = WeightBus(store)
    assert [bus.read_manifest(v).kind for v in (1, 2, 3)] == ["full", "delta", "delta"]
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine_equals(engine, state(3))
    publisher.close()


def test_a_serving_loop_holding_the_lock_never_sees_half_applied_weights(store):
    import threading

    from relayrl.weight_sync.checksum import tensor_checksum

    versions = range(1, 9)
    known = {version: {name: tensor_checksum(bits.view(np.uint8)) for name, bits in state(version).items()}
             for version in versions}
    known[0] = {name: tensor_checksum(np.zeros(size, np.uint16).view(np.uint8)) for name, size in SIZES.items()}
    engine = fresh_engine()
    seen, torn = set(), []
    stop = threading.Event()

    def serve() -> None:  # a "forward pass" reads every tensor under the serving lock
        while not stop.is_set():
            with engine.serving_lock:
                sums = {name: tensor_checksum(engine.read_bits(name)) for name in SIZES}
            matching = [version for version, expected in known.items() if expected == sums]
            if matching:
                seen.add(matching[0])
            else:
                torn.append(sums)

    server = threading.Thread(target=serve)
    server.start()
    publisher = Publisher(store, keep_versions=0, snapshot_every_versions=3)
    controller = Controller(store, engine)
    try:
        for version in versions:
            publish(publisher, version)
            controller.poll_once()
    finally:
        stop.set()
        server.join()
    assert not torn, "a forward pass saw a mix of two versions"
    assert len(seen) >= 2 and engine.pauses == len(versions)
    publisher.close()


def test_maybe_publish_publishes_every_k_steps(store):
    publisher = Publisher(store, publish_every_steps=3, keep_versions=0)
    published = [step for step in range(8) if publisher.maybe_publish(step, state(step)) is not None]
    publisher.close()
    bus = WeightBus(store)
    assert published == [0, 3, 6]
    assert [bus.read_manifest(version).step for version in bus.committed_versions()] == [0, 3, 6]


def test_explicit_version_numbers_may_skip_and_deltas_chain_over_the_gaps(store):
    # A trainer publishing every 2 steps numbers versions by its step: 2, 4, 6 (snapshot at 2).
    publisher = Publisher(store, snapshot_every_versions=50, keep_versions=0)
    engine = fresh_engine()
    controller = Controller(store, engine)
    publisher.publish(state(2), version=2).result()
    assert controller.poll_once().route == "snapshot" and engine.served_version == 2
    for version in (4, 6):
        report = publisher.publish(state(version), version=version).result()
        assert report.kind == "delta"
    manifest = publisher.bus.read_manifest(6)
    assert manifest.parent == 4
    report = controller.poll_once()
    assert report.route == "replay" and engine.served_version == 6 and engine_equals(engine, state(6))
    late = fresh_engine()  # a new engine: the snapshot at 2, then the deltas 4 and 6
    assert Controller(store, late).poll_once().route == "snapshot" and engine_equals(late, state(6))
    with pytest.raises(WeightSyncError, match="next version is 7"):
        publisher.publish(state(5), version=5)
    publisher.close()


def _flip_two_bytes(store, key: str) -> None:
    """Damage an object on disk as bad media or a buggy copy would (its checksum no longer matches)."""
    path = store._path(key)
    with open(path, "r+b") as handle:
        data = bytearray(handle.read())
        for offset in (len(data) // 3, len(data) // 2):
            data[offset] ^= 0x5A
        handle.seek(0)
        handle.write(bytes(data))


def _object_of(store, version: int) -> str:
    return WeightBus(store).read_manifest(version, cached=False).tensors[0].object_key


@pytest.mark.parametrize("damaged", ["snapshot object", "delta object", "delta manifest", "snapshot manifest"])
def test_a_corrupt_weight_object_is_repaired_by_a_fresh_snapshot_not_retried_forever(store, damaged):
    publisher = Publisher(store, keep_versions=0, snapshot_every_versions=50)
    publish(publisher, 1, 2, 3)
    running = fresh_engine()
    running_controller = Controller(store, running)
    running_controller.update_to(2)  # an engine already serving, one version behind
    bus = WeightBus(store)
    key = {"snapshot object": _object_of(store, 1), "delta object": _object_of(store, 3),
           "delta manifest": bus.manifest_key(3), "snapshot manifest": bus.manifest_key(1)}[damaged]
    _flip_two_bytes(store, key)
    new = fresh_engine()
    controller = Controller(store, new, reporter="engine-7")
    with pytest.raises(VersionUnavailable, match="version 3: no route verifies.*asked the publisher"):
        controller.poll_once()
    requests = bus.repair_requests()
    assert requests and requests[0].endswith("0000000003-engine-7") and publisher.repair_requested()
    assert controller.poll_once() is None and controller.broken == 3  # no refetch of the same broken chain
    assert new.served_version is None and not new._paused  # failed before the pause: untouched
    if damaged in ("delta object", "delta manifest"):  # the running engine cannot reach 3 either
        with pytest.raises(WeightSyncError):
            running_controller.poll_once()
    publish(publisher, 4)  # the trainer's next publish answers the request: a full snapshot
    assert publisher.last_report.kind == "full" and not bus.repair_requests()
    for engine, follower in ((new, controller), (running, running_controller)):
        report = follower.poll_once()
        assert report.version == 4 and engine_equals(engine, state(4)) and follower.broken is None
    publish(publisher, 5)  # and deltas again
    assert publisher.last_report.kind == "delta" and controller.poll_once().route == "delta"
    publisher.close()


def _engine_at_3_then_a_snapshot_with_a_bridge(store):
    """Versions 1-3, an engine serving 3, then version 4: a snapshot whose bridge delta starts from 3."""
    publisher = Publisher(store, keep_versions=0, snapshot_every_versions=3)
    publish(publisher, 1, 2, 3)
    engine = fresh_engine()
    controller = Controller(store, engine)
    controller.update_to(3)
    publish(publisher, 4)
    manifest = WeightBus(store).read_manifest(4, cached=False)
    assert manifest.kind == "full"
    return publisher, engine, controller, manifest


def test_a_corrupt_bridge_needs_no_repair_the_snapshot_route_is_intact(store):
    publisher, engine, controller, manifest = _engine_at_3_then_a_snapshot_with_a_bridge(store)
    bridge = WeightBus(store).read_bridge(manifest)
    _flip_two_bytes(store, bridge.tensors[0].object_key)
    report = controller.poll_once()
    assert report.route == "snapshot" and report.retried and engine_equals(engine, state(4))
    assert not WeightBus(store).repair_requests()
    publisher.close()


def _rewrite_manifest(store, key: str, **changes) -> None:
    """Rewrite a manifest object with ``changes``: its checksum is valid, its content is not."""
    manifest = codec.decode(store.get(key), WeightManifest)
    store.put(key, codec.encode(msgspec.structs.replace(manifest, **changes)))


def _finishes(call, *args):
    """``call(*args)``'s result or exception, from a thread that must end (a looping walk would not)."""
    outcome: list = []

    def target():
        try:
            outcome.append(call(*args))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(60)  # a hang guard, not a timing check: a correct walk takes milliseconds
    assert not worker.is_alive(), f"{call.__name__} never returned: a parent chain walk loops"
    return outcome[0]


@pytest.mark.parametrize("links", [{3: 3}, {3: 7}, {2: 3}], ids=["onto itself", "forward", "a cycle of two"])
def test_a_manifest_whose_parent_chain_loops_or_points_forward_is_corrupt_not_followed(store, tmp_path, links):
    publisher = Publisher(store, keep_versions=0, snapshot_every_versions=50)
    publish(publisher, 1, 2, 3)
    bus = WeightBus(store)
    for version, parent in links.items():
        _rewrite_manifest(store, bus.manifest_key(version), parent=parent)
    with pytest.raises(CorruptManifest, match="a parent must be an older version"):
        WeightBus(store).read_manifest(min(links))
    # Every walk down the chain ends: a route, retention's needs, a node mirror, retention itself.
    controller = Controller(store, fresh_engine(), reporter="engine-7")
    outcome = _finishes(controller.poll_once)
    assert isinstance(outcome, VersionUnavailable) and "asked the publisher" in str(outcome)
    assert _finishes(needed_versions, WeightBus(store), [3]) <= {1, 2, 3}
    mirror = NodeMirror(store, open_store(f"file://{tmp_path}/mirror"), keep_versions=2)
    _finishes(mirror.sync_once)  # ends: copies what verifies, or refuses
    mirror.close()
    _finishes(apply_retention, WeightBus(store), 1)
    # ... and the corrupt version is repaired like a corrupt object: the next publish is a snapshot.
    publish(publisher, 4)
    assert publisher.last_report.kind == "full"
    report = controller.poll_once()
    assert report.version == 4 and engine_equals(controller.engine, state(4))
    publisher.close()


def test_a_bridge_that_points_at_its_own_snapshot_is_skipped_not_followed(store):
    publisher, engine, controller, manifest = _engine_at_3_then_a_snapshot_with_a_bridge(store)
    _rewrite_manifest(store, manifest.metadata["bridge"], parent=4)
    report = _finishes(controller.poll_once)
    assert report.route == "snapshot" and engine_equals(engine, state(4))
    assert not WeightBus(store).repair_requests()
    publisher.close()


def test_a_restarted_publisher_adopts_a_committed_version_with_the_same_bits(store):
    # A resumed deterministic trainer redoes steps whose versions are on the bus already: the same
    # bits under the same number are adopted (the base of the next delta), never published twice.
    first = Publisher(store, background=False)
    publish(first, 1, 2)
    first.close()
    restarted = Publisher(store, background=False)
    assert restarted.next_version == 3 and restarted.committed(2) and not restarted.committed(5)
    assert not restarted.adopt(2, state(1))  # other bits under that number
    assert not restarted.adopt(5, state(5))  # not on the bus
    assert restarted.adopt(2, state(2))
    assert WeightBus(store).committed_versions() == [1, 2]  # nothing was published
    report = restarted.publish(state(3)).result()
    assert report.version == 3 and report.kind == "delta"  # a delta onto the adopted version 2
    assert WeightBus(store).read_manifest(3).parent == 2
    engine = fresh_engine()
    Controller(store, engine).poll_once()
    assert engine.served_version == 3 and engine_equals(engine, state(3))
    restarted.close()
