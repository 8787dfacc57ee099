"""Every package's and plugin's library code imports only what its distribution declares.

An import in a package's library code (``src/``) must name the package itself, the standard library,
a declared dependency, or a dependency of one of its extras other than ``testing`` (an optional
feature the docs name: ``relayrl-weight-sync[torch]``); modules under a
``testing/`` folder (suites and fixtures for other packages' tests) may also use the ``testing`` extra.
Imports inside ``try: ... except ImportError`` are guarded and not checked. Function-level imports
count: a user reaches them by calling the function.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = sorted(path.parent for pattern in ("packages/*/pyproject.toml", "plugins/*/pyproject.toml")
                 for path in ROOT.glob(pattern) if path.parent.name != "_template")
# Import names whose distribution is named otherwise, when the distribution is not installed here
# (the plugins' heavy backends): what their docs install.
KNOWN = {"yaml": "pyyaml", "vllm": "vllm", "deepspeed": "deepspeed", "dynamo": "ai-dynamo-runtime"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


@functools.cache
def _installed_distributions() -> dict[str, list[str]]:
    """Import name -> distributions, once: scanning every installed distribution takes a while."""
    return dict(metadata.packages_distributions())


def _distribution_of(module: str) -> str:
    """The distribution an absolute import comes from (``relayrl.weight_sync`` -> ``relayrl-weight-sync``)."""
    parts = module.split(".")
    if parts[0] == "relayrl" and len(parts) > 1:
        return "relayrl" if parts[1] == "cli" else _normalise(f"relayrl-{parts[1]}")
    if parts[0].startswith("relayrl_"):
        return _normalise(parts[0])
    installed = _installed_distributions().get(parts[0])
    if installed:
        return _normalise(installed[0])
    return _normalise(KNOWN.get(parts[0], parts[0]))


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in a ``try`` whose handlers catch ImportError (or ModuleNotFoundError)."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.Try) and node in parent.body:
            for handler in parent.handlers:
                names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
                if any(isinstance(name, ast.Name) and name.id in ("ImportError", "ModuleNotFoundError")
                       for name in names):
                    return True
        node = parent
    return False


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not _guarded(node, parents):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not _guarded(node, parents):
            if node.module == "relayrl":  # ``from relayrl import cli``: the subpackage is the import
                found += [(node.lineno, f"relayrl.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _in_a_package(path: Path, src: Path) -> bool:
    """Whether ``path`` is a module of an import package: every folder below the top-level one
    (``relayrl/<name>/``, a namespace's subpackage, or ``relayrl_<name>/``) has an ``__init__.py``."""
    folders = path.parent.relative_to(src).parts
    start = 2 if folders[:1] == ("relayrl",) else 1  # relayrl/ itself is a namespace package
    return all((src.joinpath(*folders[:depth]) / "__init__.py").exists() for depth in range(start, len(folders) + 1))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda folder: str(folder.relative_to(ROOT)))
def test_library_imports_are_declared_dependencies(folder):
    with open(folder / "pyproject.toml", "rb") as handle:
        project = tomllib.load(handle)["project"]
    own = _normalise(project["name"])
    declared = {_requirement_name(requirement) for requirement in project.get("dependencies", [])}
    extras = project.get("optional-dependencies", {})
    optional = {_requirement_name(requirement) for name, requirements in extras.items() if name != "testing"
                for requirement in requirements}
    testing = {_requirement_name(requirement) for requirement in extras.get("testing", [])}
    undeclared = []
    for path in sorted((folder / "src").rglob("*.py")):
        if not _in_a_package(path, folder / "src"):
            continue  # data shipped with the package (a task's repository), not its code
        allowed = {own} | declared | optional | (testing if "testing" in path.relative_to(folder).parts else set())
        for line, module in _imports(path):
            if module.split(".")[0] in sys.stdlib_module_names or module == "__future__":
                continue
            distribution = _distribution_of(module)
            if distribution not in allowed:
                undeclared.append(f"{path.relative_to(ROOT)}:{line}: import {module} ({distribution})")
    assert not undeclared, f"{project['name']} imports what it does not declare:\n" + "\n".join(undeclared)


# The layers, lowest first (docs/architecture.md draws them). A package's library code imports only
# packages of lower layers; its ``testing`` suites and its tests may also import its own layer (the
# trainer's suites build their models with relayrl-rollout's), never a higher one. Plugins sit above all.
LAYERS: dict[str, int] = {
    "relayrl-core": 0,
    "relayrl-algo": 1, "relayrl-buffer": 1, "relayrl-weight-sync": 1, "relayrl-sandbox": 1,
    "relayrl-trainer": 2, "relayrl-rollout": 2, "relayrl-fault-tolerance": 2,
    "relayrl-environments": 3,
    "relayrl": 4,
}
PLUGIN_LAYER = 5


def _layer(distribution: str) -> int | None:
    """The layer of a relayrl distribution (None for anything else)."""
    if distribution in LAYERS:
        return LAYERS[distribution]
    return PLUGIN_LAYER if distribution.startswith("relayrl-") else None


def _layering_violations(folder: Path, root: Path = ROOT) -> list[str]:
    with open(folder / "pyproject.toml", "rb") as handle:
        project = tomllib.load(handle)["project"]
    own = _normalise(project["name"])
    layer = _layer(own)
    assert layer is not None, f"{own} has no layer: add it to LAYERS"
    violations = []
    extras = project.get("optional-dependencies", {})
    declared = [(requirement, "dependencies") for requirement in project.get("dependencies", [])]
    declared += [(requirement, f"[{name}]") for name, requirements in extras.items() for requirement in requirements]
    for requirement, where in declared:
        target = _layer(_requirement_name(requirement))
        if target is None or _requirement_name(requirement) == own:
            continue
        ceiling = layer if where == "[testing]" else layer - 1
        if target > ceiling:
            violations.append(f"pyproject.toml {where}: {requirement} (layer {target}, {own} is layer {layer})")
    for path in sorted([*(folder / "src").rglob("*.py"), *(folder / "tests").rglob("*.py")]):
        if path.is_relative_to(folder / "src") and not _in_a_package(path, folder / "src"):
            continue  # data shipped with the package (a task's repository), not its code
        relative = path.relative_to(folder).parts
        library = relative[0] == "src" and "testing" not in relative
        for line, module in _imports(path):
            target = _layer(_distribution_of(module))
            if target is None or _distribution_of(module) == own:
                continue
            if target > (layer - 1 if library else layer):
                violations.append(f"{path.relative_to(root)}:{line}: import {module} (layer {target}, {own} is layer {layer})")
    return violations


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda folder: str(folder.relative_to(ROOT)))
def test_no_package_imports_upward(folder):
    violations = _layering_violations(folder)
    assert not violations, "imports that point up the layers (docs/architecture.md):\n" + "\n".join(violations)


def test_rollout_imports_no_environment():
    """relayrl-rollout runs environments through a Protocol and a hook; the moment it imports one
    (even in a test), the built-ins stop being plugins like any other."""
    rollout = ROOT / "packages" / "rollout"
    found = [f"{path.relative_to(ROOT)}:{line}: import {module}"
             for path in sorted(rollout.rglob("*.py")) for line, module in _imports(path)
             if module.startswith("relayrl.environments") or module.startswith("relayrl_")]
    assert not found, "relayrl-rollout imports an environment:\n" + "\n".join(found)


def test_a_backward_import_is_caught(tmp_path):
    """The checker itself: a lower package that imports a higher one is reported."""
    package = tmp_path / "buffer"
    (package / "src" / "relayrl" / "buffer").mkdir(parents=True)
    (package / "src" / "relayrl" / "buffer" / "__init__.py").write_text("from relayrl.rollout import manager\n")
    (package / "pyproject.toml").write_text('[project]\nname = "relayrl-buffer"\ndependencies = ["relayrl-trainer"]\n')
    violations = _layering_violations(package, root=tmp_path)
    assert any("import relayrl.rollout" in violation for violation in violations)
    assert any("relayrl-trainer" in violation for violation in violations)
