"""Checkpoint benchmark: what per-step async checkpoints cost the trainer, and how fast recovery is.

In one run, on a Llama-style model trained by the torch backend (Muon + AdamW state included):

* the trainer's blocking time per ``AsyncCheckpointer.save`` (the copy to CPU) as a fraction of the
  training step it follows (target <= 5%), and the background write time, local disk plus one peer;
* recovery of the newest checkpoint from the local disk, and from the peer replica after the
  node's directory is deleted (it also rebuilds the local copy), relative to each other;
* a resumed process: start-up to the first step, after a SIGKILL, compared with a fresh start.

    python benchmarks/checkpoint.py            # ~25M parameters
    python benchmarks/checkpoint.py --quick    # a CI smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, commit, write_results


def build(width: int, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=2048, hidden_size=width, num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=4, intermediate_size=4 * width, max_position_embeddings=512,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def groups(length: int):
    import torch

    from relayrl.core.arrays import pack_u32
    from relayrl.core.wire import GeneratedSpan, Group, Trajectory, TrajectorySegment, Turn

    generator = torch.Generator().manual_seed(1)
    result = []
    for g in range(4):
        trajectories = []
        for i in range(4):
            tokens = torch.randint(3, 2048, (length,), generator=generator).tolist()
            span = GeneratedSpan.build(tokens, [-1.0] * length, 0, kept=[[token] if j % 3 else [token, 7]
                                                                         for j, token in enumerate(tokens)])
            trajectories.append(Trajectory(trajectory_id=f"{g}-{i}", task_id=str(g), group_id=str(g), sample_index=i,
                                           reward=float(i % 2), segments=[TrajectorySegment(turns=[
                                               Turn(role="user", tokens=pack_u32([1, 2, 3])),
                                               Turn(role="assistant", generated=span)])]))
        result.append(Group(group_id=str(g), task_id=str(g), trajectories=trajectories))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import torch

    from relayrl.algo.config import AlgoSection
    from relayrl.algo.optim import OptimizerSection
    from relayrl.core.store import open_store
    from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer, CheckpointStore
    from relayrl.fault_tolerance.faults import delete_node_dir
    from relayrl.fault_tolerance.peers import PeerServer
    from relayrl.fault_tolerance.recovery import recover
    from relayrl.trainer.torch_backend import TorchTrainer

    width, layers, length, steps = (64, 2, 32, 3) if args.quick else (512, 6, 256, 6)
    revision = commit()
    model = build(width, layers)
    parameters = sum(p.numel() for p in model.parameters())
    trainer = TorchTrainer(model, algo=AlgoSection(optimizer=OptimizerSection(lr=1e-4)))
    batch = groups(length)
    with tempfile.TemporaryDirectory() as temp, PeerServer(Path(temp) / "peer") as peer:
        node = Path(temp) / "node"
        checkpointer = AsyncCheckpointer(open_store(str(node)), peers=[open_store(f"{peer.url}/rank0")], keep=2)
        step_times, blocking, writes = [], [], []
        for step in range(steps):
            started = time.perf_counter()
            trainer.step(batch)
            step_times.append(time.perf_counter() - started)
            result = checkpointer.save(step + 1, {"step": step + 1, "trainer": trainer.state_dict()})
            blocking.append(result.blocking_s)
            checkpointer.wait()  # measure the write on its own (in a run it overlaps the next step)
            writes.append(checkpointer.last_write_s)
        checkpointer.close()
        size_mb = (node / f"checkpoints/step-{steps:09d}/rank-00000.pt").stat().st_size / 1e6
        started = time.perf_counter()
        local = recover(CheckpointStore(open_store(str(node))))
        local_s = time.perf_counter() - started
        delete_node_dir(node)
        started = time.perf_counter()
        from_peer = recover(CheckpointStore(open_store(str(node))), [CheckpointStore(open_store(f"{peer.url}/rank0"))])
        peer_s = time.perf_counter() - started
        assert local.step == from_peer.step == steps and from_peer.rebuilt_local
        for name, value in local.state["trainer"]["model"].items():
            assert torch.equal(value, from_peer.state["trainer"]["model"][name]), name

    step_s, block_s, write_s = (statistics.median(values) for values in (step_times, blocking, writes))
    lines = [f"{parameters / 1e6:.1f}M-parameter Llama-style model, checkpoint {size_mb:.0f} MB (model + optimiser), "
             f"local disk plus one peer over loopback, median of {steps} steps; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, python {platform.python_version()}:", "",
             "| measure | seconds | ratio |", "|---|---:|---:|",
             f"| training step (median) | {step_s:.2f} | 1.00 |",
             f"| save: trainer blocked (copy to CPU) | {block_s:.4f} | {block_s / step_s:.3f} of a step (target <= 0.05) |",
             f"| save: background write, local + 1 peer | {write_s:.2f} | {write_s / step_s:.2f} of a step "
             "(overlaps the next step) |",
             f"| recover from local disk | {local_s:.2f} | 1.00 |",
             f"| recover from the peer, rebuilding the local copy | {peer_s:.2f} | {peer_s / local_s:.1f}x local |"]
    data = {"parameters": parameters, "checkpoint_mb": size_mb, "step_s": step_s, "blocking_s": block_s,
            "write_s": write_s, "recover_local_s": local_s, "recover_peer_s": peer_s}
    if args.quick:  # three more process start-ups; the fault-tolerance tests run the same kill and resume
        print("process start to ready: not measured in --quick")
    else:
        data.update(resume_vs_fresh(lines))
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("checkpoint", command=command_line(), markdown=markdown, data=data, revision=revision)
        print(f"wrote {path}")


def resume_vs_fresh(lines: list[str]) -> dict[str, float]:
    """Process start to ready-to-train: a fresh start versus a resume after SIGKILL (imports included);
    appends the two rows to ``lines``."""
    script = Path(__file__).resolve().parent.parent / "packages/fault-tolerance/tests/trainer_run.py"
    if not script.exists():
        print("resume timing skipped: packages/fault-tolerance/tests/trainer_run.py not found")
        return {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RELAYRL_FAULT_KILL", None)
    with tempfile.TemporaryDirectory() as temp:
        def timed(steps: int, kill: str | None = None) -> float:
            run_env = dict(env, **({"RELAYRL_FAULT_KILL": kill} if kill else {}))
            started = time.perf_counter()
            subprocess.run([sys.executable, str(script), f"{temp}/node", "-", str(steps), f"{temp}/out"],
                           env=run_env, capture_output=True, timeout=600)
            return time.perf_counter() - started

        fresh = timed(0)  # start-up only: imports, model, optimiser, an empty recovery
        timed(4, kill="mid-step:2")  # dies during step 2; checkpoints of steps 1 and 2 exist
        resumed = timed(2)  # start-up plus recovery of step 2; no step left to train
    lines += [f"| process start to ready, fresh | {fresh:.2f} | 1.00 |",
              f"| process start to ready, resumed after SIGKILL | {resumed:.2f} | {resumed / fresh:.2f} |"]
    return {"start_fresh_s": fresh, "start_resumed_s": resumed}


if __name__ == "__main__":
    main()
