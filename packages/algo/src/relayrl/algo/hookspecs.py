"""Hook specifications owned by relayrl-algo (documented in ``docs/plugins.md``).

Each is a registration hook: it takes no arguments, runs at start-up, and yields
:class:`relayrl.core.plugins.Registration` records. A ``factory`` is a class (or callable) taking
one config struct; when it has a ``Config`` attribute (a :class:`relayrl.core.config.Section`),
the ``*_options`` table of ``[algo]`` is decoded into it, with errors naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_algo_losses() -> Iterable[Registration[Any]]:
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
def relayrl_algo_advantage_estimators() -> Iterable[Registration[Any]]:
    """Advantage estimators, selected by ``[algo] advantage = NAME``.

    ``factory(config)`` returns a callable ``(rewards [n], group_ids [n]) -> AdvantageResult``
    giving one advantage per trajectory and counting zero-variance groups. Built in: ``grpo``,
    ``drgrpo``, ``rloo``.
    """


@hookspec
def relayrl_algo_mismatch_corrections() -> Iterable[Registration[Any]]:
    """Train/inference mismatch corrections (importance sampling), selected by ``[algo] correction``.

    ``factory(config)`` returns a callable ``(MismatchInputs) -> CorrectionResult`` giving detached
    per-token weights, a mask, and metrics; it receives each sequence's staleness. Built in:
    ``none``, ``truncated``, ``token-mask``, ``sequence-mask``, ``geometric-mask``.
    """


@hookspec
def relayrl_algo_reward_shapers() -> Iterable[Registration[Any]]:
    """Reward shapers, applied in order to every scored group (``[algo.reward_shapers.NAME]`` tables).

    ``factory(config)`` returns an object with ``__call__(group, *, step) -> Group`` (recording what
    it changed in ``reward_components``) and ``metrics(step) -> dict``. Built in: ``length-penalty``.
    """


@hookspec
def relayrl_algo_monitors() -> Iterable[Registration[Any]]:
    """Health monitors, enabled by name in ``[algo.monitors] enabled``.

    ``factory(config: MonitorsConfig)`` returns an object with ``observe(step, metrics, texts) ->
    (new_metrics, alarms)``, ``state()`` and ``restore(state)``. Built in: ``entropy``,
    ``mismatch-kl``, ``clip-fraction``, ``response-length``, ``turns``, ``tool-calls``, ``phrases``.
    """
