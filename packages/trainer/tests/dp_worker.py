"""One rank of the torch backend's data-parallel check (``test_data_parallel.py``).

``python dp_worker.py RANK WORLD PORT INPUT OUTPUT MODE``: joins a gloo group of WORLD ranks (MODE
``default``: torch.distributed's default group; ``set``: a ``ProcessGroupGloo`` of its own, made the
data-parallel group with ``set_data_parallel_group``), trains the
TorchTrainer from the model state in INPUT on INPUT's batches (the same on every rank), and rank 0
writes its final state dict and every step's metrics to OUTPUT; every rank writes how many
micro-batches it ran (forward calls) to OUTPUT.RANK.
"""

from __future__ import annotations

import datetime
import sys

import msgspec
import torch
import torch.distributed as dist

from relayrl.core.wire import Group
from relayrl.trainer.distributed import GroupCollectives, set_data_parallel_group
from relayrl.trainer.torch_backend import TorchTrainer


def main(rank: int, world: int, port: int, source: str, target: str, mode: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    if mode == "default":
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    else:
        group = dist.ProcessGroupGloo(store, rank, world, datetime.timedelta(seconds=60))
        set_data_parallel_group(GroupCollectives(group))
    payload = torch.load(source, weights_only=False)
    model = payload["model"]
    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    trainer = TorchTrainer(model, algo=payload["algo"], config=payload["config"], version=1)
    metrics = [trainer.step(msgspec.msgpack.decode(batch, type=list[Group])) for batch in payload["batches"]]
    with open(f"{target}.{rank}", "w") as handle:
        handle.write(str(forwards[0]))
    if rank == 0:
        torch.save({"state": model.state_dict(), "metrics": metrics}, target)
    if mode == "default":
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
