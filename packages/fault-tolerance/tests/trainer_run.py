"""A deterministic training run that checkpoints every step and resumes from the newest checkpoint.

Usage: python trainer_run.py NODE_DIR PEER_URL|- STEPS OUT
Set RELAYRL_FAULT_KILL=mid-step:N / mid-write:N / after-save:N to die there. OUT receives the
SHA-256 of the final weights. Each step's batch is drawn from the global torch RNG, so the run ends
with the same weights only if the RNG state is restored exactly on resume.
"""

from __future__ import annotations

import hashlib
import sys

import torch

from relayrl.algo.config import AlgoSection
from relayrl.algo.determinism import enable_determinism, rng_state, set_rng_state
from relayrl.algo.optim import OptimizerSection
from relayrl.core.arrays import pack_u32
from relayrl.core.store import open_store
from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn
from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer
from relayrl.fault_tolerance.faults import maybe_kill
from relayrl.fault_tolerance.recovery import recover
from relayrl.rollout.testing.models import tiny_llama
from relayrl.trainer.torch_backend import TorchTrainer


def batch_from_global_rng(step: int) -> list[Group]:
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            tokens = torch.randint(3, 64, (6,)).tolist()
            kept = [[token, (token + 1) % 64] if j % 2 else [token] for j, token in enumerate(tokens)]
            span = GeneratedSpan.build(tokens, (-0.7 * torch.rand(6)).tolist(), step, kept=kept)
            trajectories.append(Trajectory(
                trajectory_id=f"{step}-{g}-{i}", task_id=str(g), group_id=f"{step}-{g}", sample_index=i,
                reward=float(torch.rand(()) > 0.5),
                segments=[TrajectorySegment(turns=[Turn(role="user", tokens=pack_u32([1, 2 + g])),
                                                   Turn(role="assistant", generated=span)])]))
        groups.append(Group(group_id=f"{step}-{g}", task_id=str(g), trajectories=trajectories))
    return groups


def main(node_dir: str, peer_url: str, steps: int, out: str) -> None:
    enable_determinism(0, num_threads=1)
    trainer = TorchTrainer(tiny_llama(seed=0), algo=AlgoSection(optimizer=OptimizerSection(lr=1e-2)))
    checkpointer = AsyncCheckpointer(open_store(node_dir), peers=[open_store(peer_url)] if peer_url != "-" else [])
    start = 0
    recovered = recover(checkpointer.local, checkpointer.peers)
    if recovered is not None:
        trainer.load_state_dict(recovered.state["trainer"])
        set_rng_state(recovered.state["rng"])
        start = recovered.state["step"]
    for step in range(start, steps):
        trainer.accumulate_gradients(batch_from_global_rng(step))
        maybe_kill("mid-step", step)
        trainer.apply_gradients()
        checkpointer.save(step + 1, {"step": step + 1, "trainer": trainer.state_dict(), "rng": rng_state()})
        maybe_kill("after-save", step)
    checkpointer.close()
    digest = hashlib.sha256()
    for name, value in sorted(trainer.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.contiguous().view(torch.uint8).numpy().tobytes())
    with open(out, "w") as handle:
        handle.write(f"{digest.hexdigest()} {start}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
