"""Hook specifications owned by relayrl-trainer (documented in ``docs/plugins.md``), and the
:class:`TrainerBackend` contract next to the hook."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Kind, PluginManager, Registration, capabilities, hookspec

if TYPE_CHECKING:
    import torch

    from relayrl.algo.config import AlgoSection
    from relayrl.core.wire import Group
    from relayrl.trainer.config import TrainerSection


class TrainerBackend(Protocol):
    """What a trainer backend's factory returns (the built-in :class:`~relayrl.trainer.torch_backend.TorchTrainer`)."""

    version: int
    """The policy version of its weights (one more per optimiser step)."""
    model: torch.nn.Module
    optimizer: Any
    """A torch optimizer, or several behind one interface (Muon for matrices, AdamW for the rest)."""

    def step(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None) -> dict[str, float]:
        """One optimiser step over a batch of scored groups (``weights``: one per group, scaling its
        advantages); its metrics."""

    def accumulate_gradients(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None
                             ) -> dict[str, float]:
        """The batch's gradients, accumulated without stepping (the supervised warm-up and tests)."""

    def state_dict(self) -> dict[str, Any]:
        """Its checkpoint (this rank's shard when data-parallel)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def named_full_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model's state dict, tensor by tensor, for publishing (a sharded backend gathers one
        tensor at a time; all ranks iterate together)."""


class TrainerBackendFactory(Protocol):
    def __call__(self, model: torch.nn.Module, *, algo: AlgoSection, config: TrainerSection, version: int,
                 pm: PluginManager | None, run_config: Any = ...) -> TrainerBackend: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
TRAINER_BACKENDS: Kind[TrainerBackendFactory] = Kind("relayrl_trainer_backends", "trainer backend")


@hookspec
@capabilities(**{"data-parallel": "trains as one of several ranks under [trainer] ranks > 1 (its state_dict is "
                                   "the rank's shard)",
                 "elastic": "every rank holds the whole model and its gradient does not depend on the number of "
                            "ranks: the group may change size between steps ([trainer] elastic)"})
def relayrl_trainer_backends() -> Iterable[Registration[TrainerBackendFactory]]:
    """Trainer backends, selected by ``[trainer] backend``.

    The contract is :class:`TrainerBackendFactory` / :class:`TrainerBackend` (``run_config`` is the
    whole run configuration when there is one, ``relayrl run``: a backend takes its own section from
    it, ``[deepspeed]``); a backend passes ``relayrl.trainer.testing.TrainerBackendTests``. Built in:
    ``torch``.

    Capabilities (declared in the registration's ``capabilities``):

    ``data-parallel``
        It trains as one of several data-parallel ranks: under ``[trainer] ranks`` > 1 it is built
        in every rank's process, with torch.distributed already initialised, and every rank passes
        it the same groups; its ``state_dict()`` is then this rank's checkpoint shard.
    ``elastic``
        A data-parallel backend whose every rank holds the whole model and optimiser state, and
        whose step's gradient does not depend on the number of ranks (the built-in ``torch``
        backend): ``[trainer] elastic = true`` then lets the ranks shrink
    and regrow between steps (the group is re-formed with a new world size; ``step`` reduces over
    ``relayrl.trainer.distributed.data_parallel_group()``, which the caller sets, and a rank that
    joins receives rank 0's ``state_dict()``). A step whose collective fails must leave no gradient
    behind: it is redone.
    """
