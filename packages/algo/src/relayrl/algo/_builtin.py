"""relayrl-algo's own plugin: its hookspecs, its built-in registrations and the ``[algo]`` section."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.algo.config import MonitorsSection
    from relayrl.algo.hookspecs import (
        AdvantageEstimatorFactory,
        LossFactory,
        MismatchCorrectionFactory,
        Monitor,
        MonitorFactory,
        RewardShaperFactory,
    )


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.algo import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.algo.config import AlgoSection

    yield Registration("algo", AlgoSection, "advantages, loss, IS correction, sampling, optimiser, shapers, monitors")


@hookimpl
def relayrl_algo_losses() -> Iterator[Registration[LossFactory]]:
    from relayrl.algo.losses import CISPO, GSPO, PPOClip

    yield Registration("ppo-clip", PPOClip, "token-level PPO-clip with separate low/high clip ranges", config=PPOClip.Config)
    yield Registration("gspo", GSPO, "sequence-level (length-normalised) ratio, clipped per sequence", config=GSPO.Config)
    yield Registration("cispo", CISPO, "clipped, stop-gradient IS weight times logprob; no token loses its gradient", config=CISPO.Config)


@hookimpl
def relayrl_algo_advantage_estimators() -> Iterator[Registration[AdvantageEstimatorFactory]]:
    from relayrl.algo.advantages import GRPO, RLOO, DrGRPO

    yield Registration("grpo", GRPO, "group mean-centred rewards, optionally std-scaled", config=GRPO.Config)
    yield Registration("drgrpo", DrGRPO, "group mean-centred rewards, no std scaling (Dr.GRPO)", config=DrGRPO.Config)
    yield Registration("rloo", RLOO, "leave-one-out baseline", config=RLOO.Config)


@hookimpl
def relayrl_algo_mismatch_corrections() -> Iterator[Registration[MismatchCorrectionFactory]]:
    from relayrl.algo.correction import GeometricMask, NoCorrection, SequenceMask, TokenMask, TruncatedIS

    yield Registration("none", NoCorrection, "no correction (metrics only)", config=NoCorrection.Config)
    yield Registration("truncated", TruncatedIS, "truncated importance sampling: w = min(rho, cap)", config=TruncatedIS.Config)
    yield Registration("token-mask", TokenMask, "mask tokens whose ratio leaves [lower, upper]", config=TokenMask.Config)
    yield Registration("sequence-mask", SequenceMask, "mask sequences whose product ratio leaves [lower, upper]", config=SequenceMask.Config)
    yield Registration("geometric-mask", GeometricMask, "mask sequences whose geometric-mean ratio leaves [lower, upper]", config=GeometricMask.Config)


@hookimpl
def relayrl_algo_reward_shapers() -> Iterator[Registration[RewardShaperFactory]]:
    from relayrl.algo.length_penalty import AlternatingLengthPenalty

    yield Registration("length-penalty", AlternatingLengthPenalty,
                       "alternating length penalty over tokens, turns and tool time", config=AlternatingLengthPenalty.Config)


def _series(name: str, metric: str, direction: Literal["up", "down", "both"]) -> MonitorFactory:
    def factory(config: MonitorsSection, /) -> Monitor:
        from relayrl.algo.monitors import SeriesMonitor

        return SeriesMonitor(name, metric, direction, config.alarm)

    return factory


@hookimpl
def relayrl_algo_monitors() -> Iterator[Registration[MonitorFactory]]:
    yield Registration("entropy", _series("entropy", "entropy/token_mean", "down"), "alarm on an entropy drop")
    yield Registration("mismatch-kl", _series("mismatch-kl", "mismatch/kl_k3", "up"), "alarm on a mismatch-KL rise")
    yield Registration("clip-fraction", _series("clip-fraction", "loss/clip_fraction", "up"), "alarm on a clip-fraction jump")
    yield Registration("response-length", _series("response-length", "response/tokens_mean", "both"),
                       "alarm on a sudden response-length change")
    yield Registration("turns", _series("turns", "response/turns_mean", "both"), "alarm on a sudden change of turns")
    yield Registration("tool-calls", _series("tool-calls", "response/tool_calls_per_turn", "both"),
                       "alarm on a sudden change of tool calls per turn")

    def phrases(config: MonitorsSection, /) -> Monitor:
        from relayrl.algo.monitors import PhraseMonitor

        return PhraseMonitor("phrases", config.phrases, config.alarm)

    yield Registration("phrases", phrases, "ratios of regex phrase matches (default: the 'not okay' pattern)")
