"""Plugin loading, registries and their one-line errors, with real entry points on sys.path."""

from __future__ import annotations

import pytest

from relayrl.core.config import Section, resolve_plugin
from relayrl.core.errors import ConfigError, PluginError
from relayrl.core.hookspecs import STORES
from relayrl.core.plugins import (
    Registration,
    capabilities,
    create_plugin_manager,
    declared_capabilities,
    describe_hookspecs,
    hookimpl,
    lookup,
    registrations,
)
from relayrl.core.testing.distributions import write_distribution

DICT_STORE_PLUGIN = """
    from relayrl.core.plugins import Registration, hookimpl
    from relayrl.core.store import MemoryStore

    @hookimpl
    def relayrl_core_stores():
        yield Registration("dict", MemoryStore.from_url, "a test store")
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("RELAYRL_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("RELAYRL_DISABLE_PLUGINS", raising=False)
    return tmp_path


def test_builtin_plugin_is_loaded_with_its_distribution():
    pm = create_plugin_manager()
    info = pm.plugin_infos["relayrl-core"]
    assert info.builtin and info.distribution == "relayrl-core" and info.version
    assert "relayrl_core_stores" in pm.hooks_of("relayrl-core")
    assert {"file", "memory", "s3"} <= set(registrations(pm, "relayrl_core_stores"))


def test_third_party_registration_is_found_and_attributed(site):
    write_distribution(site, distribution="relayrl-dictstore", module="relayrl_dictstore", source=DICT_STORE_PLUGIN)
    pm = create_plugin_manager()
    stores = registrations(pm, "relayrl_core_stores")
    assert stores["dict"].plugin == "relayrl-dictstore"
    assert stores["file"].plugin == "relayrl-core"
    assert list(stores)[:3] == ["file", "memory", "s3"]  # load order: built-ins first
    assert pm.plugin_infos["relayrl-dictstore"].version == "0.1.0"


def test_duplicate_registration_names_both_plugins(site):
    write_distribution(site, distribution="relayrl-dup", module="relayrl_dup", source="""
        from relayrl.core.plugins import Registration, hookimpl

        @hookimpl
        def relayrl_core_stores():
            yield Registration("file", lambda url: None, "squats on file://")
    """)
    pm = create_plugin_manager()
    with pytest.raises(PluginError) as excinfo:
        registrations(pm, "relayrl_core_stores")
    message = str(excinfo.value)
    assert "'file'" in message and "'relayrl-core'" in message and "'relayrl-dup'" in message
    assert "\n" not in message


def test_import_error_names_plugin_and_distribution(site):
    write_distribution(site, distribution="relayrl-broken", module="relayrl_broken", source="import no_such_module_xyz\n")
    with pytest.raises(PluginError, match=r"plugin 'relayrl-broken' from relayrl-broken 0\.1\.0 .*import failed: "
                                          r"ModuleNotFoundError"):
        create_plugin_manager()


def test_unknown_hook_names_plugin_and_hook(site):
    write_distribution(site, distribution="relayrl-typo", module="relayrl_typo", source="""
        from relayrl.core.plugins import hookimpl

        @hookimpl
        def relayrl_core_storez():
            return []
    """)
    with pytest.raises(PluginError, match="plugin 'relayrl-typo': implements unknown hook 'relayrl_core_storez'"):
        create_plugin_manager()


def test_wrong_hook_arguments_are_refused(site):
    write_distribution(site, distribution="relayrl-args", module="relayrl_args", source="""
        from relayrl.core.plugins import hookimpl

        @hookimpl
        def relayrl_core_stores(unexpected):
            return []
    """)
    with pytest.raises(PluginError, match="plugin 'relayrl-args'.*unexpected"):
        create_plugin_manager()


def test_allowlist_and_denylist(site, monkeypatch):
    write_distribution(site, distribution="relayrl-dictstore", module="relayrl_dictstore", source=DICT_STORE_PLUGIN)
    monkeypatch.setenv("RELAYRL_LOAD_PLUGINS", "")
    assert "relayrl-dictstore" not in create_plugin_manager().plugin_infos
    monkeypatch.setenv("RELAYRL_LOAD_PLUGINS", "other, relayrl-dictstore")
    assert "relayrl-dictstore" in create_plugin_manager().plugin_infos
    monkeypatch.delenv("RELAYRL_LOAD_PLUGINS")
    monkeypatch.setenv("RELAYRL_DISABLE_PLUGINS", "relayrl-dictstore")
    pm = create_plugin_manager()
    assert "relayrl-dictstore" not in pm.plugin_infos
    assert "relayrl-core" in pm.plugin_infos  # built-ins are never filtered


def test_disabled_broken_plugin_does_not_break_loading(site, monkeypatch):
    write_distribution(site, distribution="relayrl-broken", module="relayrl_broken", source="raise RuntimeError('boom')\n")
    monkeypatch.setenv("RELAYRL_DISABLE_PLUGINS", "relayrl-broken")
    create_plugin_manager()


def test_package_hookspecs_arrive_through_historic_addhooks():
    """A package adds its hookspecs via relayrl_addhooks; impls registered later are checked."""

    class AreaSpecs:
        @staticmethod
        def relayrl_area_things():
            """Things of an area."""

    from relayrl.core.plugins import hookspec

    AreaSpecs.relayrl_area_things = staticmethod(hookspec(AreaSpecs.relayrl_area_things))

    class AreaPackage:
        @hookimpl
        def relayrl_addhooks(self, pluginmanager):
            pluginmanager.add_hookspecs(AreaSpecs)

        @hookimpl
        def relayrl_area_things(self):
            yield Registration("one", dict, "a thing")

    class AreaPlugin:
        @hookimpl
        def relayrl_area_things(self):
            return [Registration("two", list, "another")]

    pm = create_plugin_manager(load_entry_points=False, plugins=[("area-plugin", AreaPlugin()), ("area", AreaPackage())])
    things = registrations(pm, "relayrl_area_things")
    assert {name: record.plugin for name, record in things.items()} == {"two": "area-plugin", "one": "area"}
    assert describe_hookspecs(pm)["relayrl_area_things"] == "Things of an area."
    assert lookup(pm, "relayrl_area_things", "one", kind="thing").factory is dict
    with pytest.raises(PluginError, match=r"unknown thing 'three' \(available: one, two\)"):
        lookup(pm, "relayrl_area_things", "three", kind="thing")


def test_non_registration_records_name_the_plugin():
    class Bad:
        @hookimpl
        def relayrl_core_stores(self):
            yield ("file", None)

    pm = create_plugin_manager(load_entry_points=False, plugins=[("bad", Bad())])
    with pytest.raises(PluginError, match="plugin 'bad': relayrl_core_stores yielded .* expected a Registration"):
        registrations(pm, "relayrl_core_stores")


def test_unknown_hook_name_for_registry_is_an_error():
    with pytest.raises(PluginError, match="relayrl_nothing_here: no such hook"):
        registrations(create_plugin_manager(load_entry_points=False), "relayrl_nothing_here")


@pytest.mark.parametrize("name", ["", "has space", None])
def test_registration_names_are_validated(name):
    with pytest.raises(ValueError, match="registration name"):
        Registration(name, dict)


def test_registration_factory_must_be_callable():
    with pytest.raises(ValueError, match="factory must be callable"):
        Registration("x", 3)


def test_registrations_declare_their_config_and_capabilities():
    record = Registration("x", dict, capabilities=["elastic", "data-parallel"])
    assert record.capabilities == frozenset({"elastic", "data-parallel"}) and record.config is None
    with pytest.raises(ValueError, match="capabilities must be a collection of names"):
        Registration("x", dict, capabilities="elastic")  # a string is not a set of names
    with pytest.raises(ValueError, match="config must be a struct type"):
        Registration("x", dict, config=Section())


def test_a_kind_s_capabilities_are_a_closed_vocabulary_and_a_misspelt_one_is_refused_with_its_plugin():
    from relayrl.core.plugins import hookspec

    class AreaSpecs:
        @staticmethod
        @hookspec
        @capabilities(fast="it is fast", **{"data-parallel": "one of several ranks"})
        def relayrl_area_things():
            """Things."""

        @staticmethod
        @hookspec
        def relayrl_area_others():
            """Others: no capabilities at all."""

    class Package:
        @hookimpl
        def relayrl_addhooks(self, pluginmanager):
            pluginmanager.add_hookspecs(AreaSpecs)

    def plugin(hook, claimed):
        class Plugin:
            pass

        setattr(Plugin, hook, hookimpl(lambda self: [Registration("x", dict, capabilities=claimed)], specname=hook))
        return Plugin()

    def manager(hook, claimed):
        return create_plugin_manager(load_entry_points=False, plugins=[("area", Package()),
                                                                       ("third", plugin(hook, claimed))])

    pm = manager("relayrl_area_things", {"fast", "data-parallel"})
    assert registrations(pm, "relayrl_area_things")["x"].capabilities == {"fast", "data-parallel"}
    assert sorted(declared_capabilities(pm, "relayrl_area_things")) == ["data-parallel", "fast"]
    with pytest.raises(PluginError, match=r"plugin 'third': relayrl_area_things record 'x' claims capabilities "
                                          r"\['data_parallel'\] that the hook does not define \(defined: "
                                          r"\['data-parallel', 'fast'\]\)"):
        registrations(manager("relayrl_area_things", {"data_parallel"}), "relayrl_area_things")
    with pytest.raises(PluginError, match=r"claims capabilities \['fast'\] .*\(defined: none\)"):
        registrations(manager("relayrl_area_others", {"fast"}), "relayrl_area_others")


def test_resolve_plugin_decodes_declared_options_and_names_the_key():
    class Options(Section, kw_only=True):
        width: int = 3

        def check(self, pm, path):
            if self.width < 1:
                raise ConfigError(f"{path}.width: must be at least 1")

    class Things:
        @hookimpl
        def relayrl_core_stores(self):
            yield Registration("configured", dict, "takes options", config=Options)
            yield Registration("bare", dict, "takes none")

    pm = create_plugin_manager(load_entry_points=False, plugins=[("things", Things())])
    record, config = resolve_plugin(pm, STORES, "configured", {"width": 5}, path="x.store")
    assert record.name == "configured" and config == Options(width=5)
    assert resolve_plugin(pm, STORES, "bare", None, path="x.store")[1] is None
    for name, options, message in [("configured", {"widht": 1}, "x.store_options.widht: unknown key"),
                                   ("configured", {"width": 0}, "x.store_options.width: must be at least 1"),
                                   ("bare", {"width": 1}, "x.store_options: store 'bare' takes no options"),
                                   ("missing", {}, "x.store: unknown store 'missing'")]:
        with pytest.raises(ConfigError, match=message):
            resolve_plugin(pm, STORES, name, options, path="x.store")


def test_two_plugins_with_one_name_are_refused(site):
    write_distribution(site / "a", distribution="relayrl-a", module="relayrl_a", source="", entry_points={"same": "relayrl_a"})
    write_distribution(site / "b", distribution="relayrl-b", module="relayrl_b", source="", entry_points={"same": "relayrl_b"})
    import sys

    sys.path[:0] = [str(site / "a"), str(site / "b")]
    try:
        with pytest.raises(PluginError, match="plugin 'same' from relayrl-b .*already loaded.*relayrl-a"):
            create_plugin_manager()
    finally:
        sys.path.remove(str(site / "a"))
        sys.path.remove(str(site / "b"))
