"""Run under torchrun: a deterministic DeepSpeed run that checkpoints every step through relayrl-fault-tolerance.

Usage: torchrun --nproc_per_node=2 ds_resume_worker.py STAGE NODE_DIR PEER_URL|- STEPS OUT

Each rank's shard (DeepSpeed's files for that rank) goes to NODE_DIR and to the peer; on start the
run resumes from the newest checkpoint complete for every rank. RELAYRL_FAULT_KILL applies to rank
1 only (a rank dying, not the job). Rank 0 writes "<sha256 of the full weights> <resumed step>" to OUT.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch
import torch.distributed as dist


def batch(step: int):
    from relayrl.core.arrays import pack_u32
    from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn

    generator = torch.Generator().manual_seed(500 + step)
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            tokens = torch.randint(3, 64, (8,), generator=generator).tolist()
            kept = [[token, (token + 1) % 64] if j % 2 else [token] for j, token in enumerate(tokens)]
            span = GeneratedSpan.build(tokens, (-0.7 * torch.rand(8, generator=generator)).tolist(), step, kept=kept)
            trajectories.append(Trajectory(
                trajectory_id=f"{step}-{g}-{i}", task_id=str(g), group_id=f"{step}-{g}", sample_index=i,
                reward=float(torch.rand((), generator=generator) > 0.5),
                segments=[TrajectorySegment(turns=[Turn(role="user", tokens=pack_u32([1, 2 + g])),
                                                   Turn(role="assistant", generated=span)])]))
        groups.append(Group(group_id=f"{step}-{g}", task_id=str(g), trajectories=trajectories))
    return groups


def main(stage: int, node_dir: str, peer_url: str, steps: int, out: str) -> None:
    from relayrl.algo.config import AlgoSection
    from relayrl.algo.determinism import enable_determinism
    from relayrl.algo.optim import OptimizerSection
    from relayrl.core.store import open_store
    from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer
    from relayrl.fault_tolerance.recovery import recover
    from relayrl.rollout.testing.models import tiny_llama
    from relayrl.trainer.config import TrainerSection
    from relayrl_deepspeed.backend import DeepSpeedTrainer
    from relayrl_deepspeed.config import DeepSpeedSection

    enable_determinism(0, num_threads=1)
    trainer = DeepSpeedTrainer(tiny_llama(seed=5), algo=AlgoSection(optimizer=OptimizerSection(lr=1e-2, muon=False)),
                               config=TrainerSection(micro_batch_tokens=48),
                               deepspeed=DeepSpeedSection(zero_stage=stage, bf16=False, muon=False))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 1:
        os.environ.pop("RELAYRL_FAULT_KILL", None)
    from relayrl.fault_tolerance.faults import maybe_kill

    checkpointer = AsyncCheckpointer(open_store(node_dir), peers=[open_store(peer_url)] if peer_url != "-" else [],
                                     rank=rank, world_size=world)
    recovered = recover(checkpointer.local, checkpointer.peers)
    # Every rank must resume the same step, as relayrl run's trainer ranks agree: the peer may still be
    # finishing the last writes of the killed job while the ranks look, so one rank can see a step
    # complete that another saw incomplete. The oldest step any rank found wins.
    found = torch.tensor([recovered.step if recovered is not None else 0])
    dist.all_reduce(found, op=dist.ReduceOp.MIN)
    if recovered is not None and recovered.step != int(found):
        recovered = recover(checkpointer.local, checkpointer.peers, at_most=int(found))
    # The steps after it are redone: this rank's files of them (on the peer too) would block their
    # commits, as in relayrl run's trainer ranks.
    checkpointer.discard_after(int(found))
    start = 0
    if recovered is not None:
        trainer.load_state_dict(recovered.state["trainer"])
        start = int(recovered.state["step"])
    for step in range(start, steps):
        trainer.accumulate_gradients(batch(step))
        maybe_kill("mid-step", step)
        trainer.engine.step()
        trainer.version += 1
        checkpointer.save(step + 1, {"step": step + 1, "trainer": trainer.state_dict()})
    checkpointer.close()
    digest = hashlib.sha256()
    for name, value in trainer.named_full_parameters():  # every rank iterates (ZeRO-3 gathers)
        digest.update(name.encode())
        digest.update(value.float().contiguous().view(torch.uint8).numpy().tobytes())
    if rank == 0:
        with open(out, "w") as handle:
            handle.write(f"{digest.hexdigest()} {start}\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
