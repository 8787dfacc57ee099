"""Repository rules from the design brief that no single package can check on its own."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = {"noxfile.py", "packages", "plugins", "integration", "benchmarks", "docs", "README.md",
             "pyproject.toml", ".ci", "constraints.txt", ".gitignore", "examples"}


def _package_folders() -> list[Path]:
    return sorted(path for path in ROOT.glob("packages/*") if (path / "pyproject.toml").exists())


def test_no_package_ships_relayrl_init():
    offenders = [str(path.relative_to(ROOT)) for path in ROOT.glob("packages/*/src/relayrl/__init__.py")]
    offenders += [str(path.relative_to(ROOT)) for path in ROOT.glob("plugins/*/src/relayrl/__init__.py")]
    assert not offenders, f"relayrl is a namespace package; remove {offenders}"


def test_installed_relayrl_is_a_namespace_package():
    relayrl = importlib.import_module("relayrl")
    assert getattr(relayrl, "__file__", None) is None, f"relayrl/__init__.py installed from {relayrl.__file__}"
    assert len(list(relayrl.__path__)) >= 1


def test_every_package_follows_the_naming_convention():
    for folder in _package_folders():
        with open(folder / "pyproject.toml", "rb") as handle:
            project = tomllib.load(handle)["project"]
        name = project["name"]
        assert name == "relayrl" or name.startswith("relayrl-"), f"{folder}: distribution {name!r}"
        imports = [path.name for path in (folder / "src/relayrl").iterdir() if path.is_dir() and path.name != "__pycache__"]
        assert len(imports) == 1, f"{folder}: one import package under relayrl/, found {imports}"
        assert (folder / "README.md").exists(), f"{folder}: README.md missing"
        assert not any("torch" in dep for dep in project.get("dependencies", []) if "==" in dep), \
            f"{folder}: pin torch in constraints.txt, declare a range in the package"


def test_plugins_use_their_own_top_level_name():
    for folder in sorted(ROOT.glob("plugins/*")):
        if not (folder / "pyproject.toml").exists():
            continue
        packages = [path.name for path in (folder / "src").iterdir() if path.is_dir() and path.name != "__pycache__"]
        assert all(name.startswith("relayrl_") for name in packages), f"{folder}: {packages}"
        assert "relayrl" not in packages, f"{folder} must not ship into the relayrl namespace"


def test_top_level_layout():
    unexpected = {path.name for path in ROOT.iterdir() if not path.name.startswith(".git") and not path.name.startswith(".venv")
                  and not path.name.startswith(".nox") and path.name not in {".ruff_cache", ".mypy_cache", ".pytest_cache", ".hypothesis"}} - TOP_LEVEL
    assert not unexpected, f"unexpected top-level entries: {sorted(unexpected)}"


def test_constraints_pin_the_cpu_torch():
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.strip() for line in lines]


def test_every_built_in_capability_is_declared_by_its_hook():
    """Each kind's capability vocabulary is declared, explained, and covers what the built-ins claim."""
    from relayrl.core.plugins import create_plugin_manager, declared_capabilities, registrations

    pm = create_plugin_manager()
    for hook, expected in (("relayrl_trainer_backends", {"data-parallel", "elastic"}),
                           ("relayrl_rollout_routers", {"discovery"}), ("relayrl_sandbox_task_sources", {"detects"})):
        declared = declared_capabilities(pm, hook)
        assert set(declared) == expected and all(declared.values()), hook
        registrations(pm, hook)  # every installed plugin's claims are declared (else PluginError)


def test_every_declared_option_is_a_keyword_its_factory_takes():
    """The kinds whose factories take options as keywords (stores, engines, routers): what a registration
    declares in its ``config`` struct is what the factory accepts, with the same defaults where the
    factory states one, so ``relayrl config check`` accepts exactly what a run can build."""
    import inspect

    import msgspec

    from relayrl.core.config import Section
    from relayrl.core.plugins import create_plugin_manager, registrations

    pm = create_plugin_manager()
    checked = 0
    for hook in ("relayrl_core_stores", "relayrl_rollout_engines", "relayrl_rollout_routers"):
        for name, record in registrations(pm, hook).items():
            if record.config is None:
                continue
            assert issubclass(record.config, Section), f"{hook} {name!r}: its options must be a Section"
            parameters = inspect.signature(record.factory).parameters
            takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
            for field in msgspec.structs.fields(record.config):
                parameter = parameters.get(field.name)
                assert parameter is not None or takes_any, f"{hook} {name!r}: declares {field.name!r}, the factory lacks it"
                if parameter is not None and parameter.default is not inspect.Parameter.empty:
                    assert parameter.default == field.default, f"{hook} {name!r}: {field.name}'s default differs"
                checked += 1
    assert checked >= 5  # the built-ins' (file, s3, torch, the routers), at least
