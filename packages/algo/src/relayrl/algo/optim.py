"""Optimiser set-up: Muon for hidden weight matrices, AdamW for everything else.

Muon orthogonalises the momentum of 2-D weight matrices (Newton-Schulz iterations); it is meant
for *hidden* matrices only. Embeddings, the output head, norms and biases keep AdamW. The split is
made by name (regular expressions) and shape (Muon needs 2-D), is configurable, and is reported so
that nobody has to guess which parameter went where.

``torch.optim.Muon`` is used where the installed torch has it (2.9+); otherwise every parameter
goes to AdamW and the report says so.

Example::

    optimizer, report = build_optimizer(model, OptimizerSection(lr=1e-6))
    print(report.summary())
    optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import msgspec
import torch

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager

__all__ = [
    "CombinedOptimizer",
    "OptimizerReport",
    "OptimizerSection",
    "build_optimizer",
    "muon_available",
    "partition_parameters",
]

DEFAULT_ADAMW_PATTERNS = (r"embed", r"lm_head", r"(^|\.)wte\.", r"(^|\.)wpe\.", r"norm", r"(^|\.)ln_", r"\.bias$",
                          r"(^|\.)(gate|router)\.weight$")
"""AdamW for embeddings, heads, norms, biases and mixture-of-experts routers (a router's few rows are
scores over experts, not a hidden transform to orthogonalise); experts' 3-D tensors go to AdamW by shape."""


def muon_available() -> bool:
    return hasattr(torch.optim, "Muon")


class OptimizerSection(Section, kw_only=True):
    """``[algo.optimizer]``."""

    muon: bool = True
    """Use Muon for hidden 2-D matrices (falls back to AdamW when torch lacks it)."""
    lr: float = 1e-6
    """AdamW learning rate (and Muon's, unless muon_lr is set)."""
    muon_lr: float | None = None
    """Muon learning rate; None = lr (sensible with adjust_lr = "match_rms_adamw")."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    adjust_lr: str | None = "match_rms_adamw"
    """torch.optim.Muon's adjust_lr_fn: "match_rms_adamw" scales updates to AdamW's RMS, "original" or None."""
    adamw_patterns: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_ADAMW_PATTERNS))
    """Parameter names matching any of these regular expressions use AdamW even when 2-D."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        for key in ("lr", "muon_lr"):
            check_learning_rate(getattr(self, key), f"{path}.{key}")


def check_learning_rate(value: float | None, path: str) -> None:
    """A learning rate must be a finite number > 0 (None: inherit one); ConfigError naming ``path``."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{path}: must be a finite number > 0, got {value}")


@dataclasses.dataclass
class OptimizerReport:
    """Which parameter went to which optimiser."""

    muon: list[tuple[str, tuple[int, ...]]]
    adamw: list[tuple[str, tuple[int, ...]]]
    muon_available: bool

    def numel(self, group: str) -> int:
        entries = self.muon if group == "muon" else self.adamw
        total = 0
        for _, shape in entries:
            count = 1
            for size in shape:
                count *= size
            total += count
        return total

    def summary(self) -> str:
        lines = [f"Muon: {len(self.muon)} tensors, {self.numel('muon'):,} parameters"
                 + ("" if self.muon_available else " (torch.optim.Muon unavailable: all AdamW)"),
                 f"AdamW: {len(self.adamw)} tensors, {self.numel('adamw'):,} parameters"]
        lines += [f"  muon   {name} {list(shape)}" for name, shape in self.muon]
        lines += [f"  adamw  {name} {list(shape)}" for name, shape in self.adamw]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"muon": [name for name, _ in self.muon], "adamw": [name for name, _ in self.adamw],
                "muon_parameters": self.numel("muon"), "adamw_parameters": self.numel("adamw")}


class CombinedOptimizer:
    """Several torch optimisers stepped as one; state dicts are keyed by optimiser name."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers.values() for group in optimizer.param_groups]

    @torch.no_grad()
    def step(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state has {sorted(state)}, expected {sorted(self.optimizers)}")
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state[name])


def partition_parameters(model: torch.nn.Module, config: OptimizerSection | None = None
                         ) -> tuple[list[tuple[str, torch.nn.Parameter]], list[tuple[str, torch.nn.Parameter]]]:
    """``(muon, adamw)`` lists of ``(name, parameter)``: the split every backend applies.

    Muon takes trainable 2-D parameters whose names match none of ``adamw_patterns`` (when Muon is
    enabled and available); AdamW takes everything else. Tied parameters appear once.
    """
    config = config or OptimizerSection()
    patterns = [re.compile(pattern) for pattern in config.adamw_patterns]
    use_muon = config.muon and muon_available()
    muon_params: list[tuple[str, torch.nn.Parameter]] = []
    adamw_params: list[tuple[str, torch.nn.Parameter]] = []
    for name, parameter in model.named_parameters():  # shared (tied) parameters appear once
        if not parameter.requires_grad:
            continue
        hidden_matrix = parameter.dim() == 2 and not any(pattern.search(name) for pattern in patterns)
        (muon_params if use_muon and hidden_matrix else adamw_params).append((name, parameter))
    return muon_params, adamw_params


def build_optimizer(model: torch.nn.Module, config: OptimizerSection | None = None
                    ) -> tuple[CombinedOptimizer, OptimizerReport]:
    """Split ``model``'s trainable parameters between Muon and AdamW and build both."""
    config = config or OptimizerSection()
    muon_params, adamw_params = partition_parameters(model, config)
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if muon_params:
        optimizers["muon"] = torch.optim.Muon(
            [parameter for _, parameter in muon_params], lr=config.muon_lr if config.muon_lr is not None else config.lr,
            weight_decay=config.weight_decay, momentum=config.muon_momentum, nesterov=config.muon_nesterov,
            ns_steps=config.muon_ns_steps, adjust_lr_fn=config.adjust_lr)
    if adamw_params:
        optimizers["adamw"] = torch.optim.AdamW([parameter for _, parameter in adamw_params], lr=config.lr,
                                                betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)
    report = OptimizerReport(muon=[(name, tuple(p.shape)) for name, p in muon_params],
                             adamw=[(name, tuple(p.shape)) for name, p in adamw_params],
                             muon_available=muon_available())
    return CombinedOptimizer(optimizers), report
