"""Hook specifications owned by relayrl-algo (documented in ``docs/plugins.md``), and the typed
contract of each kind next to its hook.

Each is a registration hook: it takes no arguments, runs at start-up, and yields
:class:`relayrl.core.plugins.Registration` records. A ``factory`` is a class (or callable) taking
one config struct: the registration's declared ``config`` (a :class:`relayrl.core.config.Section`)
decoded from the ``*_options`` table of ``[algo]``, with errors naming the key; a factory whose
registration declares none is called without arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Kind, Registration, hookspec

if TYPE_CHECKING:
    import torch

    from relayrl.algo.advantages import AdvantageResult
    from relayrl.algo.config import MonitorsSection
    from relayrl.algo.correction import CorrectionResult, MismatchInputs
    from relayrl.algo.losses import Loss
    from relayrl.algo.monitors import Alarm
    from relayrl.core.wire import Group


class LossFactory(Protocol):
    """Builds a :class:`~relayrl.algo.losses.Loss` from its declared config (or from nothing)."""

    def __call__(self, config: Any = ..., /) -> Loss: ...


class AdvantageEstimator(Protocol):
    """One advantage per trajectory from its reward and group, counting zero-variance groups."""

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> AdvantageResult: ...


class AdvantageEstimatorFactory(Protocol):
    def __call__(self, config: Any = ..., /) -> AdvantageEstimator: ...


class MismatchCorrection(Protocol):
    """Detached per-token importance weights and a mask for the train/inference mismatch."""

    def __call__(self, inputs: MismatchInputs) -> CorrectionResult: ...


class MismatchCorrectionFactory(Protocol):
    def __call__(self, config: Any = ..., /) -> MismatchCorrection: ...


class RewardShaper(Protocol):
    """Changes a scored group's rewards, recording each change in ``reward_components``; nothing else of
    the group changes, the input is left as it was, and the result depends on the group and ``step``
    alone (a shaper has no state to checkpoint). ``metrics(step)``: finite floats for the step's metrics."""

    def __call__(self, group: Group, *, step: int) -> Group: ...

    def metrics(self, step: int) -> dict[str, float]: ...


class RewardShaperFactory(Protocol):
    def __call__(self, config: Any = ..., /) -> RewardShaper: ...


class Monitor(Protocol):
    """A health monitor over each step's metrics and sampled texts. ``observe`` returns the metrics it
    adds (finite) and its alarms, leaving its inputs alone; ``state()`` (msgpack-encodable) is
    checkpointed, and a monitor given it by ``restore`` observes what an uninterrupted one would.
    ``name`` keys its state inside the run's set of monitors."""

    name: str

    def observe(self, step: int, metrics: dict[str, float],
                texts: Sequence[str] = ...) -> tuple[dict[str, float], list[Alarm]]: ...

    def state(self) -> dict[str, object]: ...

    def restore(self, state: dict[str, object]) -> None: ...


class MonitorFactory(Protocol):
    def __call__(self, config: MonitorsSection, /) -> Monitor: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
LOSSES: Kind[LossFactory] = Kind("relayrl_algo_losses", "loss")
ADVANTAGE_ESTIMATORS: Kind[AdvantageEstimatorFactory] = Kind("relayrl_algo_advantage_estimators", "advantage estimator")
MISMATCH_CORRECTIONS: Kind[MismatchCorrectionFactory] = Kind("relayrl_algo_mismatch_corrections", "mismatch correction")
REWARD_SHAPERS: Kind[RewardShaperFactory] = Kind("relayrl_algo_reward_shapers", "reward shaper")
MONITORS: Kind[MonitorFactory] = Kind("relayrl_algo_monitors", "monitor")


@hookspec
def relayrl_algo_losses() -> Iterable[Registration[LossFactory]]:
    """Policy losses, selected by ``[algo] loss = NAME`` with options in ``[algo.loss_options]``.

    ``factory(config)`` returns a :class:`relayrl.algo.losses.Loss`: a callable ``loss(inputs:
    LossInputs) -> LossOutput`` over replayed logprobs that declares its ``aggregation`` (and
    ``normalizer``); it must pass ``relayrl.algo.testing.LossTests``. Built in: ``ppo-clip``, ``gspo``,
    ``cispo``. Example::

        @hookimpl
        def relayrl_algo_losses():
            yield Registration("my-loss", MyLoss, "what it optimises, in one line")
    """


@hookspec
def relayrl_algo_advantage_estimators() -> Iterable[Registration[AdvantageEstimatorFactory]]:
    """Advantage estimators, selected by ``[algo] advantage = NAME``.

    ``factory(config)`` returns a callable ``(rewards [n], group_ids [n]) -> AdvantageResult``
    giving one advantage per trajectory and counting zero-variance groups. Built in: ``grpo``,
    ``drgrpo``, ``rloo``.
    """


@hookspec
def relayrl_algo_mismatch_corrections() -> Iterable[Registration[MismatchCorrectionFactory]]:
    """Train/inference mismatch corrections (importance sampling), selected by ``[algo] correction``.

    ``factory(config)`` returns a callable ``(MismatchInputs) -> CorrectionResult`` giving detached
    per-token weights, a mask, and metrics; it receives each sequence's staleness. Built in:
    ``none``, ``truncated``, ``token-mask``, ``sequence-mask``, ``geometric-mask``.
    """


@hookspec
def relayrl_algo_reward_shapers() -> Iterable[Registration[RewardShaperFactory]]:
    """Reward shapers, applied in order to every scored group (``[algo.reward_shapers.NAME]`` tables).

    The contract is :class:`RewardShaperFactory` / :class:`RewardShaper`; a shaper passes
    ``relayrl.algo.testing.RewardShaperTests``. Built in: ``length-penalty``.
    """


@hookspec
def relayrl_algo_monitors() -> Iterable[Registration[MonitorFactory]]:
    """Health monitors, enabled by name in ``[algo.monitors] enabled``.

    The contract is :class:`MonitorFactory` / :class:`Monitor`; a monitor passes
    ``relayrl.algo.testing.MonitorTests``. Built in: ``entropy``,
    ``mismatch-kl``, ``clip-fraction``, ``response-length``, ``turns``, ``tool-calls``, ``phrases``.
    """
