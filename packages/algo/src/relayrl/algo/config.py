"""The ``[algo]`` config section and the builders that turn its names into objects.

Every name (``loss = "ppo-clip"``) is resolved against the plugin registries, and its options
table is decoded into the plugin's own ``Config`` struct, when ``relayrl config check`` runs, so a
typo in a loss option fails before a run starts::

    [algo]
    advantage = "grpo"
    loss = "ppo-clip"
    correction = "truncated"

    [algo.loss_options]
    clip_high = 0.28

    [algo.sampling]
    top_p = 0.95

    [algo.reward_shapers.length-penalty]
    budget = 4096
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from relayrl.algo.hookspecs import ADVANTAGE_ESTIMATORS, LOSSES, MISMATCH_CORRECTIONS, MONITORS, REWARD_SHAPERS
from relayrl.algo.monitors import DEFAULT_PHRASES, AlarmSection, MonitorSet
from relayrl.algo.optim import OptimizerSection
from relayrl.core.config import Section, resolve_plugin
from relayrl.core.errors import ConfigError, PluginError
from relayrl.core.plugins import Kind, PluginManager

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import RewardShaper

R = TypeVar("R")

__all__ = ["AlgoSection", "MonitorsSection", "SamplingSection", "build", "build_monitors", "build_reward_shapers"]


class SamplingSection(Section, frozen=True):
    """``[algo.sampling]``: how rollouts sample (recorded kept-sets make the trainer replay it)."""

    temperature: float = 1.0
    top_p: float = 0.95
    """Top-p threshold; 1.0 disables top-p."""
    top_k: int = 0
    """Top-k; 0 disables it."""
    max_kept: int = 1024
    """Cap on a kept-set's size (0: no cap); see docs/algorithms.md for the bias bound."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"{path}.temperature: must be > 0 for RL rollouts (greedy sampling has no gradient)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{path}.top_p: must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError(f"{path}.top_k: must be >= 0")
        if self.max_kept < 0:
            raise ConfigError(f"{path}.max_kept: must be >= 0 (0: no cap)")

    def sampler_kwargs(self) -> dict[str, object]:
        """Keyword arguments for :func:`relayrl.algo.sample_tokens`."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_kept": self.max_kept or None}


class MonitorsSection(Section, frozen=True):
    """``[algo.monitors]``."""

    enabled: list[str] = msgspec.field(default_factory=lambda: [
        "entropy", "mismatch-kl", "clip-fraction", "response-length", "turns", "tool-calls", "phrases"])
    alarm: AlarmSection = AlarmSection()
    phrases: dict[str, str] = msgspec.field(default_factory=lambda: dict(DEFAULT_PHRASES))
    """Name -> regular expression (case-insensitive) over decoded model text; ratio per step."""


class AlgoSection(Section, frozen=True):
    """``[algo]``: which estimator, loss, correction, shapers and monitors a run uses."""

    advantage: str = "grpo"
    advantage_options: dict[str, Any] = {}
    loss: str = "ppo-clip"
    loss_options: dict[str, Any] = {}
    correction: str = "truncated"
    correction_options: dict[str, Any] = {}
    reward_shapers: dict[str, dict[str, Any]] = {}
    """Shaper name -> options, applied in file order."""
    sampling: SamplingSection = SamplingSection()
    optimizer: OptimizerSection = OptimizerSection()
    monitors: MonitorsSection = MonitorsSection()
    routing_replay: bool = False
    """Mixture-of-experts policies: the engines record which experts each token was routed to, and the
    trainer recomputes logprobs with that routing forced (gates recomputed over the recorded experts).
    Off, the routing is still recorded and its agreement with the trainer's reported (``routing/*``)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        self.sampling.check(pm, f"{path}.sampling")
        self.optimizer.check(pm, f"{path}.optimizer")
        build(ADVANTAGE_ESTIMATORS, self.advantage, self.advantage_options, pm=pm, path=f"{path}.advantage")
        build(LOSSES, self.loss, self.loss_options, pm=pm, path=f"{path}.loss")
        build(MISMATCH_CORRECTIONS, self.correction, self.correction_options, pm=pm, path=f"{path}.correction")
        build_reward_shapers(self, pm=pm, path=path)
        build_monitors(self, pm=pm, path=path)


def build(kind: Kind[Callable[..., R]], name: str, options: dict[str, Any] | None = None, *,
          pm: PluginManager | None = None, path: str = "") -> R:
    """Look ``name`` up in a registry, decode ``options`` into its ``Config``, and build it.

    Errors are :class:`ConfigError`s naming ``path`` (``algo.loss``) or the option's dotted key
    (``algo.loss_options.clip_hihg``).
    """
    record, config = resolve_plugin(pm, kind, name, options, path=path, options_path=f"{path}_options" if path else "options")
    return record.factory(config) if record.config is not None else record.factory()


def build_reward_shapers(section: AlgoSection, *, pm: PluginManager | None = None,
                         path: str = "algo") -> list[RewardShaper]:
    """The configured reward shapers, in file order."""
    shapers: list[RewardShaper] = []
    for name, options in section.reward_shapers.items():
        where = f"{path}.reward_shapers.{name}"
        record, config = resolve_plugin(pm, REWARD_SHAPERS, name, options, path=where, options_path=where)
        shapers.append(record.factory(config) if record.config is not None else record.factory())
    return shapers


def build_monitors(section: AlgoSection, *, pm: PluginManager | None = None, path: str = "algo") -> MonitorSet:
    """The enabled monitors as one :class:`MonitorSet`."""
    built = []
    for name in section.monitors.enabled:
        try:
            record = MONITORS.lookup(pm, name)
        except PluginError as exc:
            raise ConfigError(f"{path}.monitors.enabled: {exc}") from None
        built.append(record.factory(section.monitors))
    return MonitorSet(built)
