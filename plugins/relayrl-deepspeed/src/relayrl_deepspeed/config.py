"""The ``[deepspeed]`` config section."""

from __future__ import annotations

from typing import Any, Literal

from relayrl.core.config import ConfigError, Section


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

    def check(self, pm: Any, path: str) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise ConfigError(f"{path}.zero_stage: must be 1, 2 or 3, got {self.zero_stage}")
