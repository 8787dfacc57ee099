"""Hook implementations of the DeepSpeed plugin (cheap to import: DeepSpeed loads in the factory)."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


def _deepspeed_trainer(model, *, run_config=None, **kwargs):
    from relayrl_deepspeed.backend import DeepSpeedTrainer

    if run_config is not None and "deepspeed" not in kwargs:
        kwargs["deepspeed"] = getattr(run_config, "deepspeed", None)
    return DeepSpeedTrainer(model, **kwargs)


@hookimpl
def relayrl_trainer_backends():
    # Data-parallel ([trainer] ranks > 1), not elastic: ZeRO shards the model and optimiser state.
    yield Registration("deepspeed", _deepspeed_trainer,
                       "DeepSpeed ZeRO 1/2/3, bf16, DeepSpeed Muon + AdamW; publishes tensor by tensor",
                       capabilities={"data-parallel"})


@hookimpl
def relayrl_core_config_sections():
    from relayrl_deepspeed.config import DeepSpeedSection

    yield Registration("deepspeed", DeepSpeedSection, "ZeRO stage, precision, optimiser and offload of the DeepSpeed backend")
