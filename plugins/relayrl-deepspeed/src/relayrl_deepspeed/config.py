"""The ``[deepspeed]`` config section."""

from __future__ import annotations

from typing import Any, Literal

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager


class DeepSpeedSection(Section, kw_only=True):
    """``[deepspeed]``: how the DeepSpeed backend shards and computes."""

    zero_stage: int = 2
    """ZeRO stage: 1 (optimiser states), 2 (+ gradients), 3 (+ parameters)."""
    bf16: bool = True
    """bf16 weights and activations with fp32 master weights (fp16 is not offered: it fails on CPU)."""
    muon: bool = True
    """DeepSpeed's Muon for hidden matrices (split as in [algo.optimizer]); AdamW for everything else."""
    offload_optimizer: bool = False
    """Keep optimiser states in CPU memory (ZeRO-Offload)."""
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; auto = nccl with CUDA, gloo otherwise."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise ConfigError(f"{path}.zero_stage: must be 1, 2 or 3, got {self.zero_stage}")

    def check_with(self, config: Any, pm: PluginManager | None, path: str) -> None:
        # Weight sync is bit-exact: engines serve model.dtype and accept only that, so a bf16 trainer can
        # only publish to engines serving bf16.
        trainer, model = getattr(config, "trainer", None), getattr(config, "model", None)
        if getattr(trainer, "backend", None) != "deepspeed" or model is None or not self.bf16:
            return
        if model.dtype != "bfloat16":
            raise ConfigError(f"{path}.bf16: publishes bfloat16 weights, but the engines serve model.dtype = "
                              f"\"{model.dtype}\": set model.dtype = \"bfloat16\" or {path}.bf16 = false")
