"""Admission policies with hand-built groups: staleness (drop, down-weight, on-policy), zero variance, chains."""

from __future__ import annotations

import pytest

from relayrl.buffer.admission import (
    ADMIT,
    Admission,
    AdmissionChain,
    StalenessPolicy,
    ZeroVariancePolicy,
    build_admission,
)
from relayrl.buffer.config import BufferSection, StalenessSection
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.hookspecs import ADMISSION_POLICIES
from relayrl.buffer.segments import GroupRef
from relayrl.buffer.testing import AdmissionPolicyTests, make_group, make_trajectory
from relayrl.core import wire
from relayrl.core.config import ConfigError, Section, load_config
from relayrl.core.errors import PluginError
from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl


def pending(group, index: int = 0) -> PendingGroup:
    return PendingGroup.from_group(GroupRef("p", 0, index), group, committed_at=0.0, ingested_at=0.0)


def test_staleness_is_measured_from_the_oldest_token_of_any_trajectory():
    # One trajectory spans versions 5..7 token by token; another is all version 8.
    mixed = make_trajectory(task_id="t", group_id="g", sample_index=0, reward=0.0,
                            versions=[5] * 20 + [6] * 20 + [7] * 24)
    fresh = make_trajectory(task_id="t", group_id="g", sample_index=1, reward=1.0, versions=8)
    group = wire.Group(group_id="g", task_id="t", trajectories=[mixed, fresh])
    item = pending(group)
    assert (item.oldest_version, item.newest_version) == (5, 8)
    assert item.staleness(9) == 4
    policy = StalenessPolicy(max_staleness=3)
    assert policy.admit(item, 8) == ADMIT
    assert policy.admit(item, 9) == Admission(drop_reason="stale")


def test_max_staleness_zero_admits_only_the_current_version():
    policy = StalenessPolicy(max_staleness=0)
    item = pending(make_group("g", version=4))
    assert policy.admit(item, 4) == ADMIT
    assert policy.admit(item, 5).drop_reason == "stale"


def test_down_weight_decays_within_the_window_then_drops():
    policy = StalenessPolicy(max_staleness=2, action="down-weight", down_weight_decay=0.5, down_weight_window=2)
    item = pending(make_group("g", version=10))
    assert policy.admit(item, 12) == ADMIT
    assert policy.admit(item, 13) == Admission(weight=0.5, weight_reason="stale")
    assert policy.admit(item, 14) == Admission(weight=0.25, weight_reason="stale")
    assert policy.admit(item, 15) == Admission(drop_reason="stale")


def test_tokens_from_a_newer_policy_than_the_trainer_are_dropped():
    # A trainer restored from a checkpoint older than weights it had already published.
    assert StalenessPolicy().admit(pending(make_group("g", version=7)), 6).drop_reason == "future_version"


def test_group_without_generated_tokens_is_dropped_with_a_reason():
    item = pending(make_group("g", generated_tokens=0))
    assert item.oldest_version is None
    assert StalenessPolicy().admit(item, 3).drop_reason == "no_generated_tokens"


@pytest.mark.parametrize(("rewards", "dropped"), [
    ((1.0, 1.0, 1.0, 1.0), True), ((0.0, 0.0), True), ((0.5,), True),
    ((0.5, 0.5 + 1e-9), True), ((0.0, 1.0, 1.0, 1.0), False), ((0.2, 0.3), False),
])
def test_zero_variance(rewards, dropped):
    verdict = ZeroVariancePolicy(tolerance=1e-6).admit(pending(make_group("g", rewards=rewards)), 0)
    assert verdict.dropped is dropped
    if dropped:
        assert verdict.drop_reason == "zero_variance"


class Halve:
    def admit(self, group, trainer_version):
        return Admission(weight=0.5, weight_reason="halved")


class Zero:
    def admit(self, group, trainer_version):
        return Admission(weight=0.0, weight_reason="zero")


def test_chain_multiplies_weights_and_stops_at_the_first_drop():
    item = pending(make_group("g", version=0, rewards=(0.0, 1.0)))
    chain = AdmissionChain([("halve", Halve()), ("stale", StalenessPolicy(0, "down-weight", 0.5, 4))])
    assert chain.admit(item, 1) == Admission(weight=0.25, weight_reason="halved+stale")
    assert chain.admit(item, 0) == Admission(weight=0.5, weight_reason="halved")
    dropping = AdmissionChain([("zero-variance", ZeroVariancePolicy()), ("halve", Halve())])
    assert dropping.admit(pending(make_group("h", rewards=(1.0, 1.0))), 0).drop_reason == "zero_variance"


def test_chain_rejects_a_zero_weight_naming_the_policy_and_group():
    with pytest.raises(ValueError, match=r"'zero'.*p/0/0"):
        AdmissionChain([("zero", Zero())]).admit(pending(make_group("g")), 0)


def test_build_admission_reads_the_config_in_order():
    config = BufferSection(admission=("zero-variance", "staleness"), staleness=StalenessSection(max_staleness=1))
    chain = build_admission(config, create_plugin_manager())
    assert [name for name, _ in chain.policies] == ["zero-variance", "staleness"]
    assert chain.policies[1][1] == StalenessPolicy(max_staleness=1)


class MinReward:
    def __init__(self, threshold):
        self.threshold = threshold

    @classmethod
    def from_config(cls, config):
        return cls(config.policy_options.get("min-reward", {}).get("threshold", 0.5))

    def admit(self, group, trainer_version):
        return ADMIT if max(group.group.rewards) >= self.threshold else Admission(drop_reason="low_reward")


class MinRewardConfig(Section):
    threshold: float = 0.5


class MinRewardPlugin:
    @hookimpl
    def relayrl_buffer_admission_policies(self):
        yield Registration("min-reward", MinReward.from_config, "drop groups whose best reward is low",
                           config=MinRewardConfig)


def test_a_plugin_policy_is_found_by_name_and_reads_its_options():
    pm = create_plugin_manager(plugins=[("relayrl-min-reward", MinRewardPlugin())])
    assert ADMISSION_POLICIES.registrations(pm)["min-reward"].plugin == "relayrl-min-reward"
    config = BufferSection(admission=("min-reward",), policy_options={"min-reward": {"threshold": 0.9}})
    chain = build_admission(config, pm)
    assert chain.admit(pending(make_group("g", rewards=(0.0, 0.8))), 0).drop_reason == "low_reward"


@pytest.mark.parametrize(("buffer", "error"), [
    ({"admission": ["staleness", "min-reward"], "policy_options": {"min-reward": {"treshold": 0.9}}},
     r"buffer\.policy_options\.min-reward\.treshold: unknown key; did you mean threshold"),
    ({"admission": ["min-reward"], "policy_options": {"min-reward": {"threshold": "high"}}},
     r"buffer\.policy_options\.min-reward\.threshold: expected float, got str"),
    ({"admission": ["staleness"], "policy_options": {"staleness": {"max": 1}}},
     r"buffer\.policy_options\.staleness: admission policy 'staleness' takes no options"),
    ({"admission": ["staleness"], "policy_options": {"min-reward": {"threshold": 0.9}}},
     r"buffer\.policy_options\.min-reward: options of a policy that buffer\.admission does not list"),
    ({"admission": ["stalenes"]}, r"buffer\.admission\[0\]: unknown admission policy 'stalenes'"),
    ({"prompts": {"scheduler": "pass_rate"}}, r"buffer\.prompts\.scheduler: unknown prompt scheduler 'pass_rate'"),
])
def test_policy_names_and_options_are_checked_when_the_config_loads(buffer, error):
    pm = create_plugin_manager(plugins=[("relayrl-min-reward", MinRewardPlugin())])
    with pytest.raises(ConfigError, match=error):
        load_config({"buffer": buffer}, pm=pm)


def test_unknown_policy_name_lists_the_known_ones():
    with pytest.raises(PluginError, match=r"unknown admission policy 'stale'.*staleness, zero-variance"):
        build_admission(BufferSection(admission=("stale",)), create_plugin_manager())


class TestStalenessPolicyConformance(AdmissionPolicyTests):
    @pytest.fixture(params=["drop", "down-weight"])
    def policy(self, request):
        return StalenessPolicy(max_staleness=1, action=request.param)


class TestZeroVariancePolicyConformance(AdmissionPolicyTests):
    @pytest.fixture
    def policy(self):
        return ZeroVariancePolicy()


class TestPluginPolicyConformance(AdmissionPolicyTests):
    @pytest.fixture
    def policy(self):
        return MinReward(0.5)
