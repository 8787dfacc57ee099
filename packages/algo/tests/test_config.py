"""The [algo] section: names and options resolved against registries at config-check time."""

from __future__ import annotations

import pytest

from relayrl.algo.config import AlgoSection, build_monitors, build_reward_shapers
from relayrl.algo.length_penalty import AlternatingLengthPenalty
from relayrl.algo.losses import PPOClip
from relayrl.core.config import ConfigError, load_config


def test_defaults_validate_and_build():
    config = load_config({})
    assert isinstance(config.algo, AlgoSection)
    assert config.algo.loss == "ppo-clip" and config.algo.sampling.top_p == 0.95
    assert len(build_monitors(config.algo).monitors) == 7


@pytest.mark.parametrize("data, message", [
    ({"algo": {"loss": "ppo-clp"}}, r"algo.loss: unknown loss 'ppo-clp' \(available: cispo, gspo, ppo-clip"),
    ({"algo": {"loss_options": {"clip_hihg": 0.3}}}, "algo.loss_options.clip_hihg: unknown key; did you mean clip_high?"),
    ({"algo": {"loss_options": {"aggregation": "mean"}}}, r"algo.loss_options.aggregation: invalid enum value .mean. \(expected one of: constant, seq-mean-token-mean, seq-mean-token-sum, token-mean\)"),
    ({"algo": {"advantage": "ppo"}}, "algo.advantage: unknown advantage estimator 'ppo'"),
    ({"algo": {"correction_options": {"cap": "big"}}}, "algo.correction_options.cap: expected float, got str"),
    ({"algo": {"reward_shapers": {"length-penalty": {"budget": -1}}}}, "algo.reward_shapers.length-penalty.budget: must be > 0"),
    ({"algo": {"reward_shapers": {"lenght-penalty": {}}}}, "algo.reward_shapers.lenght-penalty: unknown reward shaper"),
    ({"algo": {"sampling": {"top_p": 1.5}}}, r"algo.sampling.top_p: must be in \(0, 1\]"),
    ({"algo": {"monitors": {"enabled": ["entropy", "vibes"]}}}, "algo.monitors.enabled: unknown monitor 'vibes'"),
    ({"algo": {"optimizer": {"lrr": 1}}}, "algo.optimizer.lrr: unknown key; did you mean lr?"),
])
def test_bad_values_fail_at_config_check_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data)


def test_options_reach_the_built_objects():
    config = load_config({"algo": {"loss_options": {"clip_high": 0.3},
                                   "reward_shapers": {"length-penalty": {"budget": 64}}}})
    from relayrl.algo.config import build
    from relayrl.algo.hookspecs import LOSSES

    loss = build(LOSSES, config.algo.loss, config.algo.loss_options)
    assert isinstance(loss, PPOClip) and loss.config.clip_high == 0.3
    (shaper,) = build_reward_shapers(config.algo)
    assert isinstance(shaper, AlternatingLengthPenalty) and shaper.config.budget == 64.0


def test_sampling_section_maps_to_sampler_arguments():
    from relayrl.algo.config import SamplingSection

    assert SamplingSection().sampler_kwargs() == {"temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_kept": 1024}
    assert SamplingSection(max_kept=0).sampler_kwargs()["max_kept"] is None
