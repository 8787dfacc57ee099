"""The ``[trainer]`` config section."""

from __future__ import annotations

from typing import Any

from relayrl.core.config import ConfigError, Section

__all__ = ["TrainerSection"]


class TrainerSection(Section, kw_only=True):
    """``[trainer]``: how the trainer steps (the algorithm itself is ``[algo]``)."""

    backend: str = "torch"
    """Trainer backend (``relayrl_trainer_backends``): ``torch`` built in, ``deepspeed`` as a plugin."""
    micro_batch_tokens: int = 16384
    """Padded tokens per forward/backward; a batch is split into micro-batches of whole sequences."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on the full next-token distribution at trained positions."""
    batch_groups: int = 16
    """Groups per optimiser step."""
    threads: int = 0
    """torch intra-op threads for the trainer process; 0 = torch's default."""

    def check(self, pm: Any, path: str) -> None:
        if self.micro_batch_tokens <= 0:
            raise ConfigError(f"{path}.micro_batch_tokens: must be > 0")
        if self.batch_groups <= 0:
            raise ConfigError(f"{path}.batch_groups: must be > 0")
        from relayrl.core.errors import PluginError
        from relayrl.core.plugins import lookup

        try:
            lookup(pm, "relayrl_trainer_backends", self.backend, kind="trainer backend")
        except PluginError as exc:
            raise ConfigError(f"{path}.backend: {exc}") from None
