"""``[rollout]`` in a process with no environment installed: relayrl-rollout ships none, so a
trainer-only install can load a run's config, and only building the environment fails (in one line,
naming the key). With environments installed, a wrong name is refused when the config loads."""

from __future__ import annotations

import pytest

from relayrl.core.config import ConfigError, load_config
from relayrl.core.plugins import create_plugin_manager, hookimpl, registrations
from relayrl.rollout.config import build_environment


def _without_environments():
    # Every installed plugin but those that register environments (relayrl-environments, plugins).
    pm = create_plugin_manager()
    for name, plugin in list(pm.list_name_plugin()):
        if name != "relayrl-rollout" and hasattr(plugin, "relayrl_rollout_environments"):
            pm.unregister(plugin)
    assert registrations(pm, "relayrl_rollout_environments") == {}
    return pm


def test_a_config_loads_where_no_environment_is_installed_and_building_one_says_why():
    pm = _without_environments()
    config = load_config({"rollout": {"environment": "countdown", "environment_options": {"tasks": 8}}}, pm=pm)
    with pytest.raises(ConfigError, match=r"rollout\.environment: unknown environment 'countdown' \(available: none\)"):
        build_environment(config.rollout, pm=pm)


def test_with_an_environment_installed_a_wrong_name_or_option_is_refused_when_the_config_loads():
    class Environments:
        @hookimpl
        def relayrl_rollout_environments(self):
            from relayrl.core.config import Section
            from relayrl.core.plugins import Registration

            class Options(Section, kw_only=True):
                tasks: int = 1

            yield Registration("only-one", lambda config, **kwargs: None, "a test environment", config=Options)

    pm = _without_environments()
    pm.register(Environments(), name="test-environments")
    with pytest.raises(ConfigError, match=r"rollout\.environment: unknown environment 'countdwn'"):
        load_config({"rollout": {"environment": "countdwn"}}, pm=pm)
    with pytest.raises(ConfigError, match=r"rollout\.environment_options\.taks"):
        load_config({"rollout": {"environment": "only-one", "environment_options": {"taks": 3}}}, pm=pm)


@pytest.mark.parametrize(("options", "error"), [
    ({"engine_options": {"share_prefil": False}}, r"rollout\.engine_options\.share_prefil: unknown key; did you mean share_prefill"),
    ({"engine_options": {"dtype": "float16"}}, r"rollout\.engine_options\.dtype: unknown key"),  # engine_dtype's job
    ({"engine_options": {"stream_interval_s": -1}}, r"rollout\.engine_options\.stream_interval_s: must be at least 0"),
    ({"router_options": {"retry": 3}}, r"rollout\.router_options\.retry: unknown key; did you mean retries"),
    ({"router_options": {"retries": "3"}}, r"rollout\.router_options\.retries: expected int, got str"),
    ({"router": "round-robin", "router_options": {"down_for_s": -1}}, r"rollout\.router_options: retries and down_for_s"),
])
def test_engine_and_router_options_are_the_ones_their_registrations_declare(options, error):
    with pytest.raises(ConfigError, match=error):
        load_config({"rollout": options})


def test_declared_engine_and_router_options_load():
    config = load_config({"rollout": {"engine_options": {"stream_interval_s": 0, "share_prefill": False},
                                      "router_options": {"retries": 0, "down_for_s": 0.5}}})
    assert config.rollout.engine_options == {"stream_interval_s": 0, "share_prefill": False}
