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
