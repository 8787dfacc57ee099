"""``TrainerBackendTests``: the conformance suite every trainer backend passes, built in or plugin.

Subclass it and override the ``make_backend`` fixture (and ``tolerance`` where the backend computes
in another precision or order)::

    from relayrl.trainer.testing import TrainerBackendTests

    class TestMyBackend(TrainerBackendTests):
        @pytest.fixture
        def make_backend(self):
            def make(model, *, algo, config, version=0):
                return MyTrainer(model, algo=algo, config=config, version=version, pm=None)
            return make

Every check compares the backend with the reference, the built-in torch backend, on the same tiny
model and the same groups sampled by the real torch engine (kept-sets included): the same loss and
the same weights after a step (on a dense model, and on a mixture of experts with routing
replay), one version per step, a complete ``named_full_state()`` (every name
of the model's state dict, tied ones included: it is what weight sync publishes), and a checkpoint
that round-trips (a backend restored from ``state_dict()`` takes the next step exactly as the one
that wrote it: restarts change nothing).

It runs in one process; a backend that needs torch.distributed initialises a group of one in its
fixture (the DeepSpeed plugin does).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import torch

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import OptimizerSection
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.torch_backend import TorchTrainer

MakeBackend = Callable[..., Any]


def fixed_model() -> torch.nn.Module:
    """The suite's model: the tiny random Llama of relayrl-rollout's test helpers, seed 0."""
    from relayrl.rollout.testing.models import tiny_llama

    return tiny_llama(seed=0)


def fixed_moe() -> torch.nn.Module:
    """The suite's mixture of experts: relayrl-rollout's tiny random Qwen3-MoE, seed 0."""
    from relayrl.rollout.testing.models import tiny_moe

    return tiny_moe(seed=0)


def fixed_groups(model: torch.nn.Module, seed: int = 0) -> list[Any]:
    """Three groups of four sampled from ``model`` by the real torch engine (top-p kept-sets)."""
    from relayrl.rollout.testing.groups import generate_groups

    return generate_groups(copy.deepcopy(model), top_p=0.9, rewards=[[float((i + g + seed) % 3 == 0) for i in range(4)]
                                                                     for g in range(3)])


def full_state(backend: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().float().cpu().clone() for name, tensor in backend.named_full_state()}


class TrainerBackendTests:
    """Conformance suite for trainer backends (``relayrl_trainer_backends``)."""

    #: Tolerances against the fp32 torch backend: the loss (relative); every weight after one step
    #: (absolute; Adam turns a gradient near zero into a step of any size below the learning rate,
    #: so another summation order may move such an element further); the mean over all weights.
    loss_rtol = 1e-5
    weight_atol = 1e-6
    mean_atol = 1e-7

    @pytest.fixture
    def make_backend(self) -> MakeBackend:
        raise NotImplementedError("override `make_backend`: (model, *, algo, config, version=0) -> the backend")

    @pytest.fixture
    def algo(self) -> AlgoSection:
        return AlgoSection(optimizer=OptimizerSection(lr=1e-2))

    @pytest.fixture
    def config(self) -> TrainerSection:
        return TrainerSection()

    def test_a_step_matches_the_torch_backend(self, make_backend, algo, config) -> None:
        model = fixed_model()
        groups = fixed_groups(model)
        reference = TorchTrainer(copy.deepcopy(model), algo=algo, config=config)
        backend = make_backend(copy.deepcopy(model), algo=algo, config=config)
        assert backend.version == 0
        expected, got = reference.step(groups), backend.step(groups)
        assert backend.version == 1
        assert got["tokens/targets"] == expected["tokens/targets"]
        assert got["loss/value"] == pytest.approx(expected["loss/value"], rel=self.loss_rtol, abs=1e-7)
        mine, theirs = full_state(backend), full_state(reference)
        moved = max(float((theirs[name] - model.state_dict()[name].float()).abs().max()) for name in theirs)
        assert moved > 10 * self.weight_atol  # the step changed the weights, by more than the tolerance
        for name in theirs:
            torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=self.weight_atol,
                                       msg=lambda detail, name=name: f"{name}: {detail}")
        differences = torch.cat([(mine[name] - theirs[name]).abs().flatten() for name in theirs])
        assert float(differences.mean()) <= self.mean_atol

    def test_a_mixture_of_experts_step_with_routing_replay_matches_the_torch_backend(self, make_backend, algo,
                                                                                      config) -> None:
        model = fixed_moe()
        # Sampled in bfloat16 (low-precision rollouts), so the recorded routing differs from the
        # trainer's own somewhere and forcing it changes the step.
        groups = fixed_groups(model.to(torch.bfloat16))
        model = fixed_moe()
        algo = msgspec.structs.replace(algo, routing_replay=True)
        reference = TorchTrainer(copy.deepcopy(model), algo=algo, config=config)
        backend = make_backend(copy.deepcopy(model), algo=algo, config=config)
        expected, got = reference.step(groups), backend.step(groups)
        assert got["routing/replayed"] == 1.0 and got["routing/set_differs"] == expected["routing/set_differs"]
        assert got["loss/value"] == pytest.approx(expected["loss/value"], rel=self.loss_rtol, abs=1e-7)
        mine, theirs = full_state(backend), full_state(reference)
        assert list(mine) == list(theirs)  # expert and router tensors included
        for name in theirs:
            torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=self.weight_atol,
                                       msg=lambda detail, name=name: f"{name}: {detail}")

    def test_named_full_state_is_the_whole_model(self, make_backend, algo, config) -> None:
        model = fixed_model()
        backend = make_backend(copy.deepcopy(model), algo=algo, config=config)
        state = full_state(backend)
        expected = model.state_dict()
        assert list(state) == list(expected)  # every name, tied ones included, in the model's order
        for name, tensor in expected.items():
            assert state[name].shape == tensor.shape, name
            torch.testing.assert_close(state[name], tensor.float(), rtol=0, atol=0,
                                       msg=lambda detail, name=name: f"{name}: {detail}")

    def test_a_restored_checkpoint_takes_the_same_next_step(self, make_backend, algo, config) -> None:
        model = fixed_model()
        first, second = fixed_groups(model, seed=0), fixed_groups(model, seed=1)
        original = make_backend(copy.deepcopy(model), algo=algo, config=config)
        original.step(first)
        checkpoint = copy.deepcopy(original.state_dict())
        restored = make_backend(copy.deepcopy(model), algo=algo, config=config)
        restored.load_state_dict(checkpoint)
        assert restored.version == original.version == 1
        original.step(second)
        restored.step(second)
        assert restored.version == 2
        mine, theirs = full_state(restored), full_state(original)
        for name in theirs:  # bitwise: model, optimiser state and version all came back
            assert torch.equal(mine[name], theirs[name]), name
