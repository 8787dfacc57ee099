"""The [sandbox] section, the registries, and the package's hookspecs."""

from __future__ import annotations

import pytest

from relayrl.core.config import ConfigError, load_config
from relayrl.core.plugins import create_plugin_manager, describe_hookspecs
from relayrl.sandbox.api import CAPABILITIES, Limits, SandboxUnavailable
from relayrl.sandbox.config import SandboxSection, describe_protections, open_backend
from relayrl.sandbox.hookspecs import EXPLOIT_DETECTORS, SANDBOX_BACKENDS, TASK_SOURCES


def test_defaults_validate_and_require_what_an_unprivileged_user_namespace_provides():
    section = load_config({}).sandbox
    assert isinstance(section, SandboxSection) and section.backend == "auto" and section.network == "none"
    assert section.require == ["network-none", "pid-isolation", "tree-kill"] and section.max_parallel_tools == 8
    assert set(section.require) < set(CAPABILITIES)


def test_auto_opens_the_backend_with_the_most_isolation_and_says_what_it_lacks():
    try:
        backend = open_backend(section=SandboxSection(require=[]))
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox backend can start on this host: {exc}")
    assert backend.name == "process"  # the only one registered here
    line = describe_protections(backend)
    assert line.startswith("sandbox: process with ") and "\n" not in line
    for name in CAPABILITIES:
        assert name in line
    assert ("missing" in line) == (len(backend.capabilities()) < len(CAPABILITIES))


@pytest.mark.parametrize("data, message", [
    ({"sandbox": {"backend": "docker"}}, r"sandbox.backend: unknown sandbox backend 'docker' \(available: process\)"),
    ({"sandbox": {"require": ["network-nope"]}}, r"sandbox.require: unknown capabilities \['network-nope'\]"),
    ({"sandbox": {"detectors": ["vibes"]}}, "sandbox.detectors: unknown exploit detector 'vibes'"),
    ({"sandbox": {"network": "internet"}}, r"sandbox.network: invalid enum value 'internet' \(expected one of: host, none\)"),
    ({"sandbox": {"limits": {"memory": 1}}}, "sandbox.limits.memory: unknown key; did you mean"),
    ({"sandbox": {"limits": {"wall_time_s": 0}}}, "sandbox.limits.wall_time_s: must be > 0"),
    ({"sandbox": {"limits": {"address_space_bytes": -2}}},
     r"sandbox.limits.address_space_bytes: must be >= 0 \(0: automatic\), or -1 for none"),
    ({"sandbox": {"limits": {"cpu_time_s": -1}}}, r"sandbox.limits.cpu_time_s: must be >= 0$"),
    ({"sandbox": {"max_parallel_tools": 0}}, "sandbox.max_parallel_tools: must be >= 1"),
])
def test_bad_values_fail_at_config_check_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data)


def test_registries_hold_the_builtins():
    assert list(SANDBOX_BACKENDS.registrations()) == ["process"]
    assert sorted(EXPLOIT_DETECTORS.registrations()) == sorted(SandboxSection().detectors)
    assert sorted(TASK_SOURCES.registrations()) == ["directory", "jsonl"]
    assert {"relayrl_sandbox_backends", "relayrl_sandbox_exploit_detectors",
            "relayrl_sandbox_task_sources"} <= set(describe_hookspecs(create_plugin_manager()))


def test_open_backend_applies_the_section():
    section = SandboxSection(require=[], limits=Limits(wall_time_s=7))
    backend = open_backend(section=section)
    assert backend.limits.wall_time_s == 7 and backend.name == "process"


def test_an_address_space_limit_of_minus_one_means_none_even_without_a_memory_cgroup():
    load_config({"sandbox": {"limits": {"address_space_bytes": -1}}})  # accepted
    assert Limits(address_space_bytes=-1).effective_address_space(has_memory_cgroup=False) == 0
    assert Limits(memory_bytes=5).effective_address_space(has_memory_cgroup=False) == 5
    assert Limits(memory_bytes=5).effective_address_space(has_memory_cgroup=True) == 0
    assert Limits(address_space_bytes=7).effective_address_space(has_memory_cgroup=True) == 7


def test_open_backend_refuses_missing_capabilities_with_a_clear_error(monkeypatch):
    from relayrl.sandbox import host

    support = host.host_support()
    monkeypatch.setattr("relayrl.sandbox.local.host_support",
                        lambda: host.HostSupport(**{**support.__dict__, "cgroup": None,
                                                    "reasons": {"cgroup": "no writable cgroup (test)"}}))
    with pytest.raises(SandboxUnavailable, match=r"process-limit .*no writable cgroup \(test\)"):
        open_backend(section=SandboxSection(require=["memory-limit", "process-limit"]))
