"""``[rollout] router_options`` of the ``dynamo`` router are declared: a misspelt or ill-typed key fails when
the config loads, naming it (no Dynamo runtime needed)."""

from __future__ import annotations

import pytest

from relayrl.core.config import ConfigError, load_config


def test_declared_options_load():
    options = {"policy": "sticky", "discovery": "etcd", "etcd_endpoints": "http://10.0.0.2:2379", "host": "10.0.0.5"}
    assert load_config({"rollout": {"router": "dynamo", "router_options": options}}).rollout.router_options == options


@pytest.mark.parametrize(("options", "error"), [
    ({"discovry": "etcd"}, r"rollout\.router_options\.discovry: unknown key; did you mean discovery"),
    ({"policy": "least-loaded"}, r"rollout\.router_options\.policy: .*expected one of: random, round-robin, sticky"),
    ({"retries": -1}, r"rollout\.router_options: retries and down_for_s must be at least 0"),
])
def test_a_wrong_option_is_refused_with_its_dotted_key(options, error):
    with pytest.raises(ConfigError, match=error):
        load_config({"rollout": {"router": "dynamo", "router_options": options}})


def test_the_declared_options_cover_every_dynamo_setting_with_its_default():
    """``DynamoRouterConfig`` restates ``DynamoSettings`` (the factory pops those keys into it): a setting
    added or a default changed on one side only would be refused, or documented wrongly, by the other."""
    import dataclasses

    import msgspec

    from relayrl_dynamo.factory import DynamoRouterConfig
    from relayrl_dynamo.runtime import DynamoSettings

    declared = {field.name: field.default for field in msgspec.structs.fields(DynamoRouterConfig)}
    for field in dataclasses.fields(DynamoSettings):
        assert field.name in declared, f"DynamoSettings.{field.name} is not a declared router option"
        assert declared[field.name] == field.default, f"{field.name}: defaults differ"
