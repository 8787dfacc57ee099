"""Checkpoints: async save, commit records, retention, and recovery from damage and lost disks."""

from __future__ import annotations

import threading

import pytest
import torch

from relayrl.core.errors import StoreError
from relayrl.core.store import open_store
from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer, CheckpointStore
from relayrl.fault_tolerance.faults import corrupt_file, delete_node_dir, truncate_file
from relayrl.fault_tolerance.peers import PeerServer
from relayrl.fault_tolerance.recovery import recover


def state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"step": step, "model": {"w": torch.randn(64, 64, generator=generator)}, "cursor": {"segment": step * 3}}


def same(a: dict, b: dict) -> bool:
    return a["step"] == b["step"] and torch.equal(a["model"]["w"], b["model"]["w"]) and a["cursor"] == b["cursor"]


def test_async_save_and_recover(tmp_path):
    checkpointer = AsyncCheckpointer(open_store(str(tmp_path / "node")), keep=2)
    for step in range(1, 5):
        result = checkpointer.save(step, state(step))
        assert result.step == step and result.blocking_s >= 0
    checkpointer.close()
    local = checkpointer.local
    assert local.committed_steps() == [4, 3]  # retention kept the newest two
    recovered = recover(local)
    assert recovered.step == 4 and same(recovered.state, state(4)) and not recovered.rebuilt_local
    # Ranks that disagree settle on the oldest step any of them recovered.
    assert recover(local, at_most=3).step == 3 and same(recover(local, at_most=3).state, state(3))
    assert recover(local, at_most=2) is None


def test_snapshot_is_taken_at_save_time(tmp_path):
    live = state(1)
    checkpointer = AsyncCheckpointer(open_store(str(tmp_path / "node")))
    checkpointer.save(1, live)
    live["model"]["w"].add_(1.0)  # the trainer moves on before the write finishes
    checkpointer.close()
    assert torch.equal(recover(checkpointer.local).state["model"]["w"], state(1)["model"]["w"])


def test_a_save_waits_while_the_previous_one_is_still_writing(tmp_path):
    checkpointer = AsyncCheckpointer(open_store(str(tmp_path / "node")))
    release = threading.Event()
    write = checkpointer.local.write

    def slow_write(step, payload):
        release.wait()
        return write(step, payload)

    checkpointer.local.write = slow_write
    checkpointer.save(1, state(1))  # accepted: nothing else in flight
    second = threading.Thread(target=checkpointer.save, args=(2, state(2)))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # bounded: it waits for step 1's write instead of queueing a snapshot
    assert checkpointer.local.committed_steps() == []
    release.set()
    second.join()
    assert 1 in checkpointer.local.committed_steps()  # step 1 is durable once step 2 is accepted
    checkpointer.close()
    assert checkpointer.local.committed_steps()[0] == 2


def test_uncommitted_and_damaged_checkpoints_are_never_loaded(tmp_path):
    store = open_store(str(tmp_path / "node"))
    checkpoints = CheckpointStore(store)
    for step in (1, 2, 3):
        checkpoints.write(step, _payload(step))
    # Step 4: shard written, commit never (a crash in between).
    store.put("checkpoints/step-000000004/rank-00000.pt", _payload(4))
    store.put("checkpoints/latest", b"4")  # a pointer ahead of reality is ignored
    shard3 = tmp_path / "node/checkpoints/step-000000003/rank-00000.pt"
    corrupt_file(shard3, offset=100)
    shard2 = tmp_path / "node/checkpoints/step-000000002/rank-00000.pt"
    truncate_file(shard2)
    recovered = recover(checkpoints)
    assert recovered.step == 1 and same(recovered.state, state(1))
    assert recovered.discarded == [2, 3]  # committed but damaged: the caller tells the user


def test_lost_node_directory_is_rebuilt_from_a_peer(tmp_path):
    with PeerServer(tmp_path / "peer-node") as peer:
        checkpointer = AsyncCheckpointer(open_store(str(tmp_path / "node")), peers=[open_store(f"{peer.url}/rank0")])
        for step in (1, 2):
            checkpointer.save(step, state(step))
        checkpointer.close()
        delete_node_dir(tmp_path / "node")
        local = CheckpointStore(open_store(str(tmp_path / "node")))
        peers = [CheckpointStore(open_store(f"{peer.url}/rank0"))]
        recovered = recover(local, peers)
        assert recovered.step == 2 and recovered.rebuilt_local and same(recovered.state, state(2))
        assert recovered.source.startswith("relayrl-peer://")
        assert local.committed_steps() == [2] and local.verify(2)  # the local copy is back


def test_a_damaged_local_shard_is_read_from_the_peer(tmp_path):
    with PeerServer(tmp_path / "peer-node") as peer:
        checkpointer = AsyncCheckpointer(open_store(str(tmp_path / "node")), peers=[open_store(f"{peer.url}/r0")])
        checkpointer.save(7, state(7))
        checkpointer.close()
        corrupt_file(tmp_path / "node/checkpoints/step-000000007/rank-00000.pt", offset=-40)
        recovered = recover(checkpointer.local, checkpointer.peers)
        assert recovered.step == 7 and recovered.rebuilt_local and same(recovered.state, state(7))


def test_a_checkpoint_needs_every_rank(tmp_path):
    store = open_store(str(tmp_path / "node"))
    rank0, rank1 = CheckpointStore(store, rank=0, world_size=2), CheckpointStore(store, rank=1, world_size=2)
    rank0.write(1, _payload(1))
    rank1.write(1, _payload(1))
    rank0.write(2, _payload(2))  # rank 1 died before writing step 2
    assert rank0.committed_steps() == [1]
    assert recover(rank1).step == 1


def test_resuming_discards_the_later_steps_of_this_rank_so_they_can_be_redone(tmp_path):
    store = open_store(str(tmp_path / "node"))
    rank0 = AsyncCheckpointer(store, rank=0, world_size=2)
    rank1 = AsyncCheckpointer(store, rank=1, world_size=2)
    for step in (1, 2):
        rank0.save(step, state(step))
        rank1.save(step, state(step))
    rank0.save(3, state(3))  # rank 1 died before committing step 3
    rank0.wait()
    rank1.wait()
    assert recover(rank0.local).step == 2
    redone = state(3)
    redone["cursor"]["segment"] += 1  # the redone step differs (another batch, another timestamp ...)
    with pytest.raises(StoreError, match="already committed with other content"):
        rank0.local.write(3, _payload_of(redone))  # without the discard, the stale commit blocks the redo
    assert rank0.discard_after(2) == [3] and rank1.discard_after(2) == []
    rank0.save(3, redone)
    rank1.save(3, redone)
    rank0.close()
    rank1.close()
    assert recover(rank0.local).step == 3 and same(recover(rank1.local).state, redone)
    assert rank0.local.committed_steps()[0] == 3 and recover(rank0.local, at_most=2).step == 2


def _payload(step: int) -> bytes:
    return _payload_of(state(step))


def _payload_of(value: dict) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()
