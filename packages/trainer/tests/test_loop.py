"""relayrl-trainer's TrainingLoop embedded without relayrl run: real buffer, publisher, checkpointer
and metrics on a local bus; it trains what the fleet committed, publishes engines' weights, and a
loop restored from its checkpoint continues without training any group twice."""

from __future__ import annotations

import copy
import json
import threading

import msgspec
import pytest
import torch

from relayrl.algo.config import AlgoSection, build_monitors
from relayrl.algo.optim import OptimizerSection
from relayrl.buffer import (
    Buffer,
    BufferSection,
    Progress,
    SegmentWriter,
    StalenessSection,
    read_progress,
    write_progress,
)
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


@pytest.mark.parametrize(("every", "published"), [(1, [1, 2, 3, 4]), (2, [1, 3, 4]), (5, [1, 4])])
def test_weights_are_published_every_k_steps_and_after_the_last(tmp_path, every, published):
    model = tiny_llama(seed=1)
    loop, bus = make_loop(tmp_path, copy.deepcopy(model), steps=3, hooks=None)
    loop.publish_every_steps = every
    commit(bus, model, 6)
    loop.run()
    close(loop)
    # Version 1 at the start, then the versions after steps 1-3 that are due; the last step's always.
    assert WeightBus(bus).committed_versions() == published


def test_checkpoint_every_k_steps_saves_the_due_steps_and_a_stopped_loops_last_one(tmp_path):
    model = tiny_llama(seed=2)
    loop, bus = make_loop(tmp_path, copy.deepcopy(model), steps=5, hooks=None)
    loop.checkpoint_every = 2
    commit(bus, model, 10)
    assert loop.run() == 5
    close(loop)
    store = AsyncCheckpointer(open_store(str(tmp_path / "checkpoints")), keep=10).local
    # Steps 2 and 4 (due), 5 (the last); every record of a step that was not checkpointed says so.
    assert sorted(store.committed_steps()) == [2, 4, 5]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert ["checkpoint/blocking_s" in record["metrics"] for record in records] == [False, True, False, True, True]
    recovered = recover(store)
    assert recovered.step == 5 and recovered.state["step"] == 5

    # Stopped after step 3 (not due): the loop checkpoints it before it ends, so the stop loses nothing.
    stopped_root = tmp_path / "stopped"
    stopped_root.mkdir()
    stop = threading.Event()

    class StopAfterThree(LoopHooks):
        def on_step(self, step, version, metrics, alarms):
            if step == 3:
                stop.set()

    loop, bus = make_loop(stopped_root, copy.deepcopy(model), steps=0, hooks=StopAfterThree())
    loop.checkpoint_every = 2
    commit(bus, model, 10)
    assert loop.run(stop) == 3
    close(loop)
    recovered = recover(AsyncCheckpointer(open_store(str(stopped_root / "checkpoints"))).local)
    assert recovered.step == 3
    for name, value in loop.backend.model.state_dict().items():  # the weights after step 3
        assert torch.equal(recovered.state["trainer"]["model"][name], value), name


class Renumbering(Recording):
    def __init__(self):
        super().__init__()
        self.renumbered: list[tuple[int, int]] = []

    def on_renumbered(self, version, published_as):
        self.renumbered.append((version, published_as))


def staged_run(root, model, groups, *, steps, reproducible, hooks, checkpoint=None):
    """A loop over ``groups`` committed in order (two per step, their tokens sampled at the version the
    step trains: staleness 0), restored from ``checkpoint`` when given."""
    bus = open_store(str(root / "bus"))
    if not bus.list("rollouts/"):
        writer = SegmentWriter(bus, "fleet-0", groups_per_segment=1)
        for group in groups:
            writer.commit([group])
    backend = TorchTrainer(copy.deepcopy(model), algo=ALGO, version=1)
    loop = TrainingLoop(
        backend, buffer=Buffer(bus, BufferSection(batch_groups=2, poll_interval_s=0.05,
                                                  staleness=StalenessSection(max_staleness=2))),
        publisher=Publisher(bus), checkpointer=AsyncCheckpointer(open_store(str(root / "checkpoints"))),
        monitors=build_monitors(ALGO), metrics=MetricsWriter(root, tensorboard=False),
        progress=lambda step, version, consumed: None, steps=steps, hooks=hooks, wait_timeout_s=0.1,
        reproducible=reproducible)
    if checkpoint is not None:
        backend.load_state_dict(checkpoint.state["trainer"])
        loop.restore(checkpoint.state)
    return loop, bus


def crash_and_resume(root, model, groups, *, reproducible):
    """Train 4 steps, lose the checkpoints of steps 3 and 4 (written after the crash's last good one),
    resume from step 2 and train to 6. The bus keeps every version the lost steps published."""
    first = Recording()
    loop, _ = staged_run(root, model, groups, steps=4, reproducible=reproducible, hooks=first)
    loop.run()
    close(loop)
    checkpoints = open_store(str(root / "checkpoints"))
    for key in checkpoints.list("checkpoints/"):
        if "/step-000000003/" in key or "/step-000000004/" in key:
            checkpoints.delete(key)
    recovered = recover(AsyncCheckpointer(checkpoints).local)
    assert recovered.step == 2
    second = Renumbering()
    resumed, bus = staged_run(root, model, groups, steps=6, reproducible=reproducible, hooks=second,
                              checkpoint=recovered)
    stop = threading.Event()
    timer = threading.Timer(30.0, stop.set)  # a run that drops groups never reaches step 6: end it
    timer.start()
    resumed.run(stop)
    timer.cancel()
    close(resumed)
    return resumed, bus, first, second


@pytest.fixture(scope="module")
def staged():
    model = tiny_llama(seed=3)
    groups = []
    for step in range(1, 7):  # the groups of step k were sampled at version k (the trainer's before it)
        for group in generate_groups(copy.deepcopy(model), groups=2, version=step):
            groups.append(msgspec.structs.replace(group, group_id=f"s{step}-{group.group_id}"))
    return model, groups


def test_a_reproducible_loop_resumed_after_a_crash_redoes_the_lost_steps_bit_for_bit(tmp_path, staged):
    model, groups = staged
    clean = Recording()
    uninterrupted, clean_bus = staged_run(tmp_path / "clean", model, groups, steps=6, reproducible=True, hooks=clean)
    uninterrupted.run()
    close(uninterrupted)
    assert len([ref for _, refs in clean.resolved for ref in refs]) == 12  # staleness 0: every group trained

    resumed, bus, _, second = crash_and_resume(tmp_path / "crash", model, groups, reproducible=True)
    assert second.renumbered == []  # the same numbers: no group looks staler than it was
    assert [len(refs) for _, refs in second.resolved] == [2, 2, 2, 2]  # steps 3-6 trained the same groups
    assert resumed.backend.version == uninterrupted.backend.version == 7
    assert WeightBus(bus).committed_versions() == WeightBus(clean_bus).committed_versions() == list(range(1, 8))
    mine, theirs = dict(resumed.backend.named_full_state()), dict(uninterrupted.backend.named_full_state())
    for name in theirs:
        assert torch.equal(mine[name], theirs[name]), name


def test_without_reproducibility_a_resume_renumbers_and_the_staler_groups_drop(tmp_path, staged):
    # What a resume did before deterministic runs kept their numbers: the recovered weights went out
    # above the lost steps' versions, so the groups of the redone steps looked staler and dropped.
    model, groups = staged
    resumed, _, _, second = crash_and_resume(tmp_path, model, groups, reproducible=False)
    assert sum(len(refs) for _, refs in second.resolved) < 8 and resumed.backend.version > 7


def test_a_starved_loop_publishes_again_the_weights_a_store_outage_refused(tmp_path):
    """A publish that failed leaves the engines behind for good unless the trainer, with nothing to
    train, publishes again: ``republish_reason`` says why, ``republish`` retries until the store takes it."""
    from relayrl.core.errors import StoreError
    from relayrl.core.store import LocalStore

    class Outage(LocalStore):
        down = False

        def put(self, key, data, *, if_absent=False):
            if Outage.down:
                raise StoreError(f"writing {key} failed: the store is down")
            return super().put(key, data, if_absent=if_absent)

    loop, _ = make_loop(tmp_path, tiny_llama(seed=1), steps=1, hooks=Recording())
    bus = Outage(f"file://{tmp_path}/bus")
    loop.publisher = Publisher(bus)
    first = loop.publish_current()
    assert loop.republish_reason() is None
    Outage.down = True
    loop.backend.version += 1  # a step trained: its publish fails
    with pytest.raises(StoreError):
        loop.publisher.publish(dict(loop.backend.named_full_state()), version=loop.backend.version).result()
    reason = loop.republish_reason()
    assert reason and f"did not take version {first + 1}" in reason
    assert isinstance(loop.republish(reason), StoreError)  # still down: said, not raised; retried at the next check
    Outage.down = False
    assert loop.republish(reason) is None
    assert loop.republish_reason() is None
    newest = WeightBus(bus).newest_version()
    assert newest > first and newest == loop.backend.version
    close(loop)
