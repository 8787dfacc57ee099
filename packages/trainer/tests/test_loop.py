"""relayrl-trainer's TrainingLoop embedded without relayrl run: real buffer, publisher, checkpointer
and metrics on a local bus; it trains what the fleet committed, publishes engines' weights, and a
loop restored from its checkpoint continues without training any group twice."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch

from relayrl.algo.config import AlgoSection, build_monitors
from relayrl.algo.optim import OptimizerSection
from relayrl.buffer import Buffer, BufferSection, Progress, SegmentWriter, read_progress, write_progress
from relayrl.core.store import open_store
from relayrl.fault_tolerance.checkpoint import AsyncCheckpointer
from relayrl.fault_tolerance.recovery import recover
from relayrl.rollout.testing.groups import generate_groups
from relayrl.rollout.testing.models import tiny_llama
from relayrl.trainer.loop import LoopHooks, TrainingLoop
from relayrl.trainer.metrics import MetricsWriter
from relayrl.trainer.torch_backend import TorchTrainer
from relayrl.weight_sync import Controller, Publisher, StateDictAdapter, WeightBus

ALGO = AlgoSection(optimizer=OptimizerSection(lr=1e-2))


class Recording(LoopHooks):
    def __init__(self):
        self.resolved: list[tuple[int, list[str]]] = []
        self.steps: list[int] = []

    def on_resolved(self, step, trained, dropped):
        self.resolved.append((step, trained))

    def on_step(self, step, version, metrics, alarms):
        self.steps.append(step)


def make_loop(tmp_path, model, *, steps, hooks):
    bus = open_store(str(tmp_path / "bus"))
    backend = TorchTrainer(model, algo=ALGO, version=1)
    loop = TrainingLoop(
        backend, buffer=Buffer(bus, BufferSection(batch_groups=2, poll_interval_s=0.05)),
        publisher=Publisher(bus), checkpointer=AsyncCheckpointer(open_store(str(tmp_path / "checkpoints"))),
        monitors=build_monitors(ALGO), metrics=MetricsWriter(tmp_path, tensorboard=False),
        progress=lambda step, version, consumed: write_progress(bus, Progress(step=step, version=version,
                                                                               consumed=consumed)),
        steps=steps, hooks=hooks, wait_timeout_s=0.1)
    return loop, bus


def commit(bus, model, count):
    """The fleet's part: ``count`` groups sampled from ``model`` at version 1, one segment each."""
    writer = SegmentWriter(bus, "fleet-0", groups_per_segment=1)
    for group in generate_groups(copy.deepcopy(model), groups=count, version=1):
        writer.commit([group])


def close(loop):
    for part in (loop.checkpointer, loop.publisher, loop.metrics, loop.buffer):
        part.close()


def test_the_loop_trains_what_the_fleet_committed_publishes_and_resumes_exactly_once(tmp_path):
    model = tiny_llama(seed=0)
    first = Recording()
    loop, bus = make_loop(tmp_path, copy.deepcopy(model), steps=2, hooks=first)
    commit(bus, model, 4)
    assert loop.run(threading.Event()) == 2
    close(loop)
    assert first.steps == [1, 2] and read_progress(bus) == Progress(step=2, version=3, consumed={"fleet-0": 4})
    trained = [ref for _, refs in first.resolved for ref in refs]
    assert len(trained) == len(set(trained)) == 4
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    # An engine bootstraps from the published versions and serves the trainer's weights, bit for bit.
    served = {name: torch.zeros_like(value) for name, value in loop.backend.model.state_dict().items()}
    controller = Controller(bus, StateDictAdapter(served))
    report = controller.poll_once()
    assert report.version == 3
    for name, value in loop.backend.model.state_dict().items():
        assert torch.equal(served[name], value), name
    controller.close()

    # A new process: the backend and the loop restored from the newest checkpoint continue after it.
    second = Recording()
    recovered = recover(AsyncCheckpointer(open_store(str(tmp_path / "checkpoints"))).local)
    assert recovered is not None and recovered.step == 2
    resumed, bus = make_loop(tmp_path, copy.deepcopy(model), steps=3, hooks=second)
    resumed.backend.load_state_dict(recovered.state["trainer"])
    resumed.restore(recovered.state)
    assert resumed.step == 2 and resumed.backend.version == 3
    commit(bus, model, 2)
    assert resumed.run(threading.Event()) == 3
    close(resumed)
    again = [ref for _, refs in second.resolved for ref in refs]
    assert len(again) == 2 and not set(again) & set(trained)  # only the new groups: none trained twice
    assert read_progress(bus).consumed == {"fleet-0": 6}


@pytest.mark.parametrize("every", [1, 2])
def test_weights_are_published_every_k_steps(tmp_path, every):
    model = tiny_llama(seed=1)
    loop, bus = make_loop(tmp_path, copy.deepcopy(model), steps=2, hooks=None)
    loop.publish_every_steps = every
    commit(bus, model, 4)
    loop.run()
    close(loop)
    assert WeightBus(bus).committed_versions() == ([1, 2, 3] if every == 1 else [1, 3])
