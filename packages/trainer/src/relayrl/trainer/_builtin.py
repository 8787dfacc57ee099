"""relayrl-trainer's own plugin: its hookspecs, the torch backend and the ``[trainer]`` section."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    import torch

    from relayrl.trainer.hookspecs import TrainerBackend, TrainerBackendFactory


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.trainer import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.trainer.config import TrainerSection

    yield Registration("trainer", TrainerSection, "trainer backend, micro-batching, clipping, batch size")


def _torch_trainer(model: torch.nn.Module, *, run_config: Any = None, **kwargs: Any) -> TrainerBackend:  # the torch backend has no section of its own
    from relayrl.trainer.torch_backend import TorchTrainer

    return TorchTrainer(model, **kwargs)


@hookimpl
def relayrl_trainer_backends() -> Iterator[Registration[TrainerBackendFactory]]:
    # Every rank holds the whole model (gradients are all-reduced) and the batch's gradient does not
    # depend on the number of ranks: data-parallel, and elastic.
    yield Registration("torch", _torch_trainer, "plain torch: replay, correction, loss, Muon + AdamW; data-parallel and elastic over ranks",
                       capabilities={"data-parallel", "elastic"})
