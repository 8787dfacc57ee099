"""The ``[buffer]`` config section and its sub-tables, with documented defaults.

Example::

    [buffer]
    batch_groups = 16
    admission = ["staleness", "zero-variance"]

    [buffer.staleness]
    max_staleness = 2          # 0 = synchronous on-policy training
    action = "down-weight"

    [buffer.prompts]
    difficulty_filter = true
    band = [0.05, 0.6]
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from relayrl.core.config import Section, resolve_plugin
from relayrl.core.errors import ConfigError, PluginError
from relayrl.core.plugins import PluginManager

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class StalenessSection(Section):
    """``[buffer.staleness]``: how far behind the trainer a group's oldest token may be."""

    max_staleness: NonNegativeInt = 4
    """Largest admitted ``trainer_version - oldest token version``; 0 is synchronous on-policy training."""
    action: Literal["drop", "down-weight"] = "drop"
    """What happens beyond ``max_staleness``: drop the group, or keep it with a smaller weight."""
    down_weight_decay: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.5
    """With ``down-weight``: weight ``decay ** (staleness - max_staleness)``."""
    down_weight_window: NonNegativeInt = 4
    """With ``down-weight``: groups more than this many versions past ``max_staleness`` are dropped."""


class RestartSection(Section):
    """``[buffer.restart]``: re-balancing the backlog that accumulated while the trainer was down."""

    rebalance_batches: NonNegativeInt = 8
    """Batches after a ``restore`` drawn stratified to the running mix; 0 turns re-balancing off."""
    stratum: str = "task_id"
    """Task part of a stratum: ``task_id`` or ``metadata:<key>`` (a group metadata key, e.g. a task family)."""
    duration_buckets_s: tuple[float, ...] = (60.0, 600.0, 3600.0)
    """Edges (seconds) of the trajectory-duration buckets; a group's duration is its longest trajectory's."""
    mix_decay: Fraction = 0.9
    """Per-batch decay of the running mix (an exponential moving average of stratum shares)."""


class PromptsSection(Section):
    """``[buffer.prompts]``: the rollout side's prompt scheduler and difficulty filter."""

    scheduler: str = "pass-rate"
    """Name of the scheduler in the ``relayrl_buffer_prompt_schedulers`` registry."""
    difficulty_filter: bool = False
    """Keep only tasks whose estimated pass rate lies in ``band`` (others are re-tested at ``retest_rate``)."""
    band: tuple[Fraction, Fraction] = (0.01, 0.75)
    """Inclusive pass-rate band of kept tasks: solved a low but non-zero fraction of the time."""
    retest_rate: Fraction = 0.05
    """Chance that an excluded task is scheduled anyway when its turn comes, so it can come back."""
    min_samples: NonNegativeInt = 8
    """Samples needed before a task's estimate is trusted; until then it is always scheduled."""
    success_threshold: float = 0.5
    """A trajectory counts as a pass when its reward is at least this."""
    estimate_decay: Fraction = 0.95
    """Per-group decay of a task's pass/attempt counts, so that estimates follow the improving policy."""


class BufferSection(Section):
    """``[buffer]``: producer segments, admission, batching and restart policy of the rollout buffer."""

    prefix: str = "rollouts"
    """Store prefix of rollout segments: ``<prefix>/<producer_id>/<sequence>.seg``."""
    groups_per_segment: PositiveInt = 4
    """Producer side: groups per committed segment (a dead producer loses at most one segment)."""
    batch_groups: PositiveInt = 16
    """Groups per batch, when ``token_budget`` is 0."""
    token_budget: NonNegativeInt = 0
    """If > 0, a batch is the longest run of complete groups whose tokens fit this budget."""
    admission: tuple[str, ...] = ("staleness", "zero-variance")
    """Admission policies applied in order (registry ``relayrl_buffer_admission_policies``); the first drop wins."""
    zero_variance_tolerance: Annotated[float, msgspec.Meta(ge=0.0)] = 1e-6
    """``zero-variance`` drops a group when its largest and smallest rewards differ by at most this."""
    ingest_threads: PositiveInt = 4
    """Segments fetched and decoded in parallel per poll (object-store latency dominates)."""
    max_pending_groups: PositiveInt = 100_000
    """Stop ingesting (leave segments in the store) while this many groups wait: bounded memory."""
    poll_interval_s: Annotated[float, msgspec.Meta(gt=0.0)] = 0.5
    """Pause between polls while waiting for a batch."""
    staleness: StalenessSection = StalenessSection()
    restart: RestartSection = RestartSection()
    prompts: PromptsSection = PromptsSection()
    policy_options: dict[str, dict[str, Any]] = {}
    """Options of admission policies, by policy name: each table is checked against the ``config`` struct
    the policy's registration declares (a policy that declares none takes none)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        # Names and options fail when the config loads, naming the key, not when the trainer builds the chain.
        from relayrl.buffer.hookspecs import ADMISSION_POLICIES, PROMPT_SCHEDULERS

        try:
            PROMPT_SCHEDULERS.lookup(pm, self.prompts.scheduler)
        except PluginError as exc:
            raise ConfigError(f"{path}.prompts.scheduler: {exc}") from None
        for index, name in enumerate(self.admission):
            resolve_plugin(pm, ADMISSION_POLICIES, name, self.policy_options.get(name), path=f"{path}.admission[{index}]",
                           options_path=f"{path}.policy_options.{name}")
        unused = sorted(set(self.policy_options) - set(self.admission))
        if unused:
            raise ConfigError(f"{path}.policy_options.{unused[0]}: options of a policy that {path}.admission does not "
                              f"list ({', '.join(self.admission) or 'none'})")
