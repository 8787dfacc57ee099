"""One replica of an elastic data-parallel run: python elastic_worker.py MEMBER_ID DIR STEPS.

Every step's global batch is a pure function of the step number, so any replica (and a reference
single-process run) trains on the same data. While DIR/pause exists no step starts. Appends one JSON line per step to DIR/log-MEMBER.jsonl
and writes its final state dict to DIR/final-MEMBER.pt.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from relayrl.algo.config import AlgoSection
from relayrl.algo.determinism import enable_determinism
from relayrl.algo.optim import OptimizerSection
from relayrl.core.arrays import pack_u32
from relayrl.core.store import open_store
from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn
from relayrl.fault_tolerance.elastic import ElasticTrainer
from relayrl.fault_tolerance.membership import StoreMembership
from relayrl.rollout.testing.models import tiny_llama
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer


def batch(step: int) -> list[Group]:
    generator = torch.Generator().manual_seed(1000 + step)
    groups = []
    for g in range(3):
        trajectories = []
        for i in range(4):
            tokens = torch.randint(3, 64, (8,), generator=generator).tolist()
            kept = [[token, (token + 1) % 64, (token + 5) % 64] if j % 2 else [token] for j, token in enumerate(tokens)]
            span = GeneratedSpan.build(tokens, (-0.7 * torch.rand(8, generator=generator)).tolist(), 1, kept=kept)
            trajectories.append(Trajectory(
                trajectory_id=f"{step}-{g}-{i}", task_id=str(g), group_id=f"{step}-{g}", sample_index=i,
                reward=float(torch.rand((), generator=generator) > 0.5),
                segments=[TrajectorySegment(turns=[Turn(role="user", tokens=pack_u32([1, 2 + g, 5])),
                                                   Turn(role="assistant", generated=span)])]))
        groups.append(Group(group_id=f"{step}-{g}", task_id=str(g), trajectories=trajectories))
    return groups


def make_trainer() -> TorchTrainer:
    algo = AlgoSection(optimizer=OptimizerSection(lr=1e-2, muon=False))
    # Small micro-batches: every replica has several of the batch's sequences to process.
    return TorchTrainer(tiny_llama(seed=0), algo=algo, config=TrainerSection(micro_batch_tokens=40), version=1)


def main(member: str, directory: str, steps: int) -> None:
    enable_determinism(0, num_threads=1)
    root = Path(directory)
    membership = StoreMembership(open_store(str(root / "bus")), ttl_s=1.5)
    elastic = ElasticTrainer(make_trainer(), membership, member, root / "rendezvous", timeout_s=15)
    with open(root / f"log-{member}.jsonl", "a", buffering=1) as log:
        while elastic.steps_done < steps:
            while (root / "pause").exists():  # the test holds the run while a replica (re)starts
                time.sleep(0.05)
            step = elastic.steps_done
            metrics = elastic.step(batch(step))
            log.write(json.dumps({"step": step, "world": metrics["elastic/world_size"], "loss": metrics["loss/value"],
                                  "generation": metrics["elastic/generation"]}) + "\n")
            time.sleep(0.2)  # room for the test to act between steps
    torch.save(elastic.trainer.model.state_dict(), root / f"final-{member}.pt")
    elastic.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
