"""Config loading: unknown keys with suggestions, typed errors with paths, --set overrides."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from relayrl.core.config import RunSection, Section, apply_overrides, convert, load_config, parse_override
from relayrl.core.errors import ConfigError
from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl


class Optimizer(Section):
    name: str = "adamw"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)


class Schedule(Section):
    kind: str = "constant"
    warmup: Annotated[int, msgspec.Meta(ge=0)] = 0


class Trainer(Section):
    steps: int = 100
    optimizer: Optimizer = Optimizer()
    schedules: list[Schedule] = []
    extra: dict[str, Optimizer] = {}
    maybe: Optimizer | None = None


class TrainerPackage:
    @hookimpl
    def relayrl_core_config_sections(self):
        yield Registration("trainer", Trainer, "test trainer section")


@pytest.fixture
def pm():
    return create_plugin_manager(load_entry_points=False, plugins=[("trainer-package", TrainerPackage())])


def write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_valid_file_decodes_with_defaults(tmp_path, pm):
    config = load_config(write(tmp_path, '[run]\nname = "q"\n[trainer.optimizer]\nlr = 3e-4\n'), pm=pm)
    assert config.run == RunSection(name="q")
    assert config.trainer.optimizer.lr == 3e-4
    assert config["trainer"].steps == 100
    assert config.store.url == ""
    assert config.to_builtins()["trainer"]["optimizer"]["betas"] == (0.9, 0.99)


@pytest.mark.parametrize("text, message", [
    ("[trainer.optimizer]\nlrr = 1\n", "trainer.optimizer.lrr: unknown key; did you mean lr?"),
    ("[trainr]\nsteps = 1\n", "trainr: unknown key; did you mean trainer?"),
    ("[trainer]\nzzz = 1\n", r"trainer.zzz: unknown key \(known: extra, maybe, optimizer, schedules, steps\)"),
    ("[[trainer.schedules]]\nkind = 'cos'\n[[trainer.schedules]]\nwarmpu = 3\n",
     r"trainer.schedules\[1\].warmpu: unknown key; did you mean warmup\?"),
    ("[trainer.extra.a]\nlrr = 1\n", "trainer.extra.a.lrr: unknown key; did you mean lr?"),
    ("[trainer.maybe]\nnam = 'x'\n", "trainer.maybe.nam: unknown key; did you mean name?"),
    ("[run]\nseed = 'one'\n", "run.seed: expected int, got str"),
    ("[trainer.optimizer]\nbetas = [0.9]\n", "trainer.optimizer.betas: expected array of length 2, got 1"),
    ("[[trainer.schedules]]\nwarmup = -1\n", r"trainer.schedules\[0\].warmup: expected int >= 0"),
    ("run = 3\n", "run: expected a table, got int"),
    ("[run\n", "invalid TOML"),
])
def test_errors_name_the_dotted_path(tmp_path, pm, text, message):
    with pytest.raises(ConfigError, match=message) as excinfo:
        load_config(write(tmp_path, text), pm=pm)
    assert str(excinfo.value).startswith(str(tmp_path / "run.toml"))
    assert "\n" not in str(excinfo.value)


def test_missing_file_is_named(tmp_path, pm):
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        load_config(tmp_path / "nope.toml", pm=pm)


def test_overrides_are_applied_before_validation(tmp_path, pm):
    path = write(tmp_path, "[trainer]\nsteps = 5\n")
    config = load_config(path, pm=pm, overrides=["trainer.steps=7", "trainer.optimizer.lr=2e-5", "run.name=abc",
                                                  "store.url=s3://bucket/run", "store.options.endpoint_url=http://127.0.0.1:9"])
    assert config.trainer.steps == 7
    assert config.trainer.optimizer.lr == 2e-5
    assert config.run.name == "abc"
    assert config.store.options == {"endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(ConfigError, match="trainer.optimizer.lrr: unknown key; did you mean lr"):
        load_config(path, pm=pm, overrides=["trainer.optimizer.lrr=1"])
    with pytest.raises(ConfigError, match="trainer.steps: expected int, got str"):
        load_config(path, pm=pm, overrides=["trainer.steps=many"])


def test_store_options_are_the_ones_its_backend_declares(tmp_path, pm):
    """[store.options] is checked against the backend of the URL's scheme (the run directory's when empty)."""
    assert load_config({"store": {"options": {"fsync": False}}}, pm=pm).store.options == {"fsync": False}
    with pytest.raises(ConfigError, match=r"store.options.fsyn: unknown key; did you mean fsync"):
        load_config({"store": {"options": {"fsyn": False}}}, pm=pm)
    s3 = {"url": "s3://bucket/run"}
    assert load_config({"store": {**s3, "options": {"endpoint_url": "http://127.0.0.1:9", "anon": True}}}, pm=pm)
    with pytest.raises(ConfigError, match=r"store.options.endpoint: unknown key; did you mean endpoint_url"):
        load_config({"store": {**s3, "options": {"endpoint": "http://127.0.0.1:9"}}}, pm=pm)
    with pytest.raises(ConfigError, match=r"store.options.anon: expected bool, got str"):
        load_config({"store": {**s3, "options": {"anon": "yes"}}}, pm=pm)
    with pytest.raises(ConfigError, match=r"store.options.endpoint_url: unknown key"):  # not an option of a directory
        load_config({"store": {"options": {"endpoint_url": "http://127.0.0.1:9"}}}, pm=pm)


def test_parse_override_values():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=1e-4") == (["a"], 1e-4)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override('a="quoted"') == (["a"], "quoted")
    assert parse_override("a=s3://bucket/x") == (["a"], "s3://bucket/x")
    for bad in ["novalue", "=3", "a..b=1"]:
        with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
            parse_override(bad)


def test_override_through_a_value_is_refused():
    with pytest.raises(ConfigError, match="trainer.steps is a value, not a table"):
        apply_overrides({"trainer": {"steps": 1}}, ["trainer.steps.x=1"])


def test_convert_works_on_any_section_type():
    assert convert({"lr": 1}, Optimizer).lr == 1.0
    with pytest.raises(ConfigError, match="opt.lr: expected float, got str"):
        convert({"lr": "x"}, Optimizer, path="opt")


def test_mapping_source_is_not_mutated(pm):
    raw = {"trainer": {"steps": 3}}
    config = load_config(raw, pm=pm, overrides=["trainer.steps=4"])
    assert config.trainer.steps == 4 and raw == {"trainer": {"steps": 3}}


def test_typed_section_registry_and_attribute_errors(pm):
    from relayrl.core.hookspecs import CONFIG_SECTIONS

    sections = CONFIG_SECTIONS.registrations(pm)
    assert sections["trainer"].factory is Trainer and sections["run"].plugin == "relayrl-core"
    config = load_config({}, pm=pm)
    assert not hasattr(config, "nonexistent")
    with pytest.raises(ConfigError, match=r"nonexistent: no such config section \(known: run, store, trainer\)"):
        config["nonexistent"]
