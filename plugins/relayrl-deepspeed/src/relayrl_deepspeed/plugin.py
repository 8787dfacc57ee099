"""Hook implementations of the DeepSpeed plugin (cheap to import: DeepSpeed loads in the factory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    import torch

    from relayrl.trainer.hookspecs import TrainerBackend, TrainerBackendFactory


def _deepspeed_trainer(model: torch.nn.Module, *, run_config: Any = None, **kwargs: Any) -> TrainerBackend:
    from relayrl_deepspeed.backend import DeepSpeedTrainer

    if run_config is not None and "deepspeed" not in kwargs:
        kwargs["deepspeed"] = getattr(run_config, "deepspeed", None)
    return DeepSpeedTrainer(model, **kwargs)


@hookimpl
def relayrl_trainer_backends() -> Iterator[Registration[TrainerBackendFactory]]:
    # Data-parallel ([trainer] ranks > 1), not elastic: ZeRO shards the model and optimiser state.
    yield Registration("deepspeed", _deepspeed_trainer,
                       "DeepSpeed ZeRO 1/2/3, bf16, DeepSpeed Muon + AdamW; publishes tensor by tensor",
                       capabilities={"data-parallel"})


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl_deepspeed.config import DeepSpeedSection

    yield Registration("deepspeed", DeepSpeedSection, "ZeRO stage, precision, optimiser and offload of the DeepSpeed backend")
