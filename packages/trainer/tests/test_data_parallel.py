"""The torch backend as data-parallel ranks: the batch's step does not depend on how many ranks take it.

Two and three gloo ranks train the same batches as one process (two over torch.distributed's default
group, three over a group of their own set with ``set_data_parallel_group``, as elastic ranks do);
every rank runs its share of the
micro-batches, gradients and metric sums are all-reduced, and the weights after three steps must
match the single process's (up to the order of floating-point sums). With three ranks and a batch of
fewer micro-batches than ranks in one step, a rank has nothing to run: the metric reduction must
still agree on names.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import OptimizerSection
from relayrl.rollout.testing.groups import generate_groups
from relayrl.rollout.testing.models import tiny_llama
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer

WORKER = Path(__file__).with_name("dp_worker.py")
EXACT_METRICS = ("tokens/total", "tokens/targets", "batch/sequences")  # counts: summed exactly over ranks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("world", "mode"), [(2, "default"), (3, "set")])
def test_ranks_train_the_batch_as_one_process_does(tmp_path, world, mode):
    model = tiny_llama(seed=0)
    # Three batches; the small token budget splits each into several micro-batches (the last batch
    # into fewer than three, so with three ranks one rank runs none in that step).
    batches = [generate_groups(copy.deepcopy(model), groups=groups, size=4, max_tokens=8, version=1)
               for groups in (4, 3, 1)]
    # AdamW with eps = 1 is momentum SGD: the optimiser passes the gradient's small reduction-order
    # differences through instead of amplifying them (Adam's g / sqrt(v) on tiny gradients, Muon's
    # Newton-Schulz iterations), so the comparison can be tight.
    algo = AlgoSection(optimizer=OptimizerSection(lr=1.0, eps=1.0, muon=False))
    config = TrainerSection(micro_batch_tokens=48)
    source, target = tmp_path / "input.pt", tmp_path / "output.pt"
    torch.save({"model": copy.deepcopy(model), "algo": algo, "config": config,
                "batches": [msgspec.msgpack.encode(batch) for batch in batches]}, source)

    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parent))
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), str(port), str(source), str(target), mode],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in range(world)]
    outputs = [rank.communicate(timeout=300)[0].decode() for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(outputs)

    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    reference = TorchTrainer(model, algo=algo, config=config, version=1)
    expected = [reference.step(batch) for batch in batches]
    shares = [int(Path(f"{target}.{rank}").read_text()) for rank in range(world)]
    # Each rank ran its share of the micro-batches, not the whole batch.
    assert sum(shares) == forwards[0] and max(shares) < forwards[0], (shares, forwards[0])
    result = torch.load(target, weights_only=False)
    initial = tiny_llama(seed=0).state_dict()
    for name, tensor in model.state_dict().items():
        change = (tensor - initial[name]).abs().max().item()
        difference = (result["state"][name] - tensor).abs().max().item()
        assert change > 1e-4, f"{name}: the steps barely changed it ({change}); the comparison would prove nothing"
        assert difference <= 1e-3 * change, f"{name}: ranks and one process differ by {difference} (change {change})"
    for step, (got, want) in enumerate(zip(result["metrics"], expected)):
        for name in EXACT_METRICS:
            assert got[name] == want[name], (step, name)
        for name in ("loss/value", "entropy/token_mean", "entropy/kept_mean", "mismatch/kl_k3", "grad/norm"):
            assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), (step, name)
