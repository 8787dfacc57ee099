"""One rank of the torch backend's data-parallel check (``test_data_parallel.py``).

``python dp_worker.py RANK WORLD PORT INPUT OUTPUT``: joins a gloo group of WORLD ranks, trains the
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
from relayrl.trainer.torch_backend import TorchTrainer


def main(rank: int, world: int, port: int, source: str, target: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
