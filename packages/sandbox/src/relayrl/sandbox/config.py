"""The ``[sandbox]`` config section, the registries of this package, and :func:`open_backend`.

::

    [sandbox]
    backend = "auto"                   # the strongest installed backend this host can run; or "process", "bwrap"
    network = "none"                   # "host" opts out of the network namespace, knowingly
    require = ["network-none", "readonly-system", "memory-limit", "process-limit"]
    max_parallel_tools = 8

    [sandbox.limits]
    wall_time_s = 30
    memory_bytes = 1073741824

Names (backend, capabilities, detectors) are checked by ``relayrl config check``; whether *this*
host can provide the required capabilities is checked when a backend is opened, because the
trainer's host validates the same file but never runs a sandbox.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from relayrl.core.config import Section
from relayrl.core.errors import ConfigError, PluginError
from relayrl.core.plugins import PluginManager
from relayrl.sandbox.api import CAPABILITIES, Limits, SandboxBackend, SandboxUnavailable
from relayrl.sandbox.hookspecs import EXPLOIT_DETECTORS, SANDBOX_BACKENDS

__all__ = ["AUTO", "DEFAULT_DETECTORS", "DEFAULT_REFERENCE_GLOBS", "DEFAULT_REQUIRE", "SandboxSection",
           "describe_protections", "open_backend"]

AUTO = "auto"
"""``[sandbox] backend = "auto"``: of the installed backends, the one that provides the most isolation
properties on this host (bwrap before process on a tie: it starts faster)."""

DEFAULT_REQUIRE = ["network-none", "pid-isolation", "tree-kill"]
"""What graded tasks need from any sandbox, and what an unprivileged user namespace provides: no
network, no view of (or signal to) host processes, nothing left running. Root adds the rest
(read-only host, own uid, memory/process/disk limits); require them to refuse hosts without."""

DEFAULT_REFERENCE_GLOBS = [
    "**/*.orig", "**/*.rej", "**/*.patch", "**/*.diff", "**/SOLUTION*", "**/solution*", "**/*_solution.*",
    "**/reference/**", "**/hidden_tests/**", "**/.hidden*/**", "**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**",
    "**/.mypy_cache/**", "**/.ruff_cache/**", "**/.tox/**", "**/.nox/**", "**/*.egg-info/**", "**/.coverage*",
    "**/htmlcov/**", "**/.ipynb_checkpoints/**",
]
"""Reference artifacts removed from every agent workspace (solutions, patches, hidden tests, caches)."""

DEFAULT_DETECTORS = ["test-edits", "history-access", "network", "outside-writes", "runner-tampering",
                     "literal-special-casing"]


class SandboxSection(Section, frozen=True):
    """``[sandbox]``: where agent tools run, how isolated, and how answers are graded."""

    backend: str = AUTO
    """``auto`` (the strongest installed backend this host can run), or a name from
    ``relayrl_sandbox_backends`` (``process`` built in; ``bwrap`` with relayrl-bwrap)."""
    network: Literal["none", "host"] = "none"
    """``none``: a private network namespace with only loopback (implies requiring ``network-none``)."""
    require: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_REQUIRE))
    """Capabilities the backend must provide on this host, or refuse to start (default :data:`DEFAULT_REQUIRE`;
    every capability the host offers is used whatever this says)."""
    root: str = ""
    """Directory sandboxes are created in; empty: ``RELAYRL_SANDBOX_ROOT`` or ``/var/lib/relayrl-sandbox``."""
    hide_paths: list[str] = []
    """Host paths no command may see (task data: hidden tests, gold patches); the shipped tasks always are."""
    expose_paths: list[str] = []
    """Host paths commands see read-only besides the system directories (/usr, /etc, ...; see
    :mod:`relayrl.sandbox.view`): nothing else of the host exists in a sandbox."""
    limits: Limits = Limits()
    """Per-sandbox resource limits (see :class:`relayrl.sandbox.api.Limits`)."""
    max_parallel_tools: int = 8
    """Tool calls of one turn that run at once; results are always returned in call order."""
    tool_timeout_s: float = 30.0
    """Default timeout of one tool call (clamped by ``limits.wall_time_s``)."""
    reference_globs: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_REFERENCE_GLOBS))
    """Globs removed from every agent workspace (a task's ``reference_globs`` are added)."""
    detectors: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_DETECTORS))
    """Exploit detectors run on every graded trajectory; any flag sets the reward to 0."""
    grading_timeout_s: float = 120.0
    """Timeout of one answer's grading command (clamped by the grading backend's ``limits.wall_time_s``)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        try:
            if self.backend != AUTO:
                SANDBOX_BACKENDS.lookup(pm, self.backend)
        except PluginError as exc:
            raise ConfigError(f"{path}.backend: {exc}") from None
        unknown = [name for name in self.require if name not in CAPABILITIES]
        if unknown:
            raise ConfigError(f"{path}.require: unknown capabilities {unknown} (known: {', '.join(sorted(CAPABILITIES))})")
        detectors = EXPLOIT_DETECTORS.registrations(pm)
        for name in self.detectors:
            if name not in detectors:
                raise ConfigError(f"{path}.detectors: unknown exploit detector {name!r} "
                                  f"(available: {', '.join(sorted(detectors))})")
        if self.max_parallel_tools < 1:
            raise ConfigError(f"{path}.max_parallel_tools: must be >= 1")
        for key in ("tool_timeout_s", "grading_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{path}.{key}: must be > 0")
        required = ("wall_time_s", "memory_bytes", "max_processes", "max_output_bytes", "disk_bytes")
        for field in msgspec.structs.fields(Limits):
            value = getattr(self.limits, field.name)
            if field.name in required and value <= 0:
                raise ConfigError(f"{path}.limits.{field.name}: must be > 0")
            if field.name == "address_space_bytes" and value < -1:
                raise ConfigError(f"{path}.limits.{field.name}: must be >= 0 (0: automatic), or -1 for none")
            if field.name != "address_space_bytes" and value < 0:
                raise ConfigError(f"{path}.limits.{field.name}: must be >= 0")


def open_backend(name: str | None = None, *, section: SandboxSection | None = None, pm: PluginManager | None = None,
                 **overrides: Any) -> SandboxBackend:
    """Build backend ``name`` (default: the section's) with the section's limits and requirements.

    Raises :class:`relayrl.sandbox.api.SandboxUnavailable` when the host cannot provide a required
    capability, and :class:`relayrl.core.errors.PluginError` for an unknown name.
    """
    section = section or SandboxSection()
    options: dict[str, Any] = {"limits": section.limits, "require": section.require, "network": section.network,
                               "root": section.root or None, "hide_paths": section.hide_paths,
                               "expose_paths": section.expose_paths}
    options.update(overrides)
    name = name or section.backend
    if name != AUTO:
        return SANDBOX_BACKENDS.lookup(pm, name).factory(**options)
    table = SANDBOX_BACKENDS.registrations(pm)
    order = sorted(table, key=lambda candidate: (candidate != "bwrap", candidate != "process", candidate))
    opened: list[SandboxBackend] = []
    refusals: list[SandboxUnavailable] = []
    for candidate in order:
        try:
            opened.append(table[candidate].factory(**options))
        except SandboxUnavailable as exc:
            refusals.append(exc)
    if not opened:
        raise refusals[-1] if refusals else PluginError("no sandbox backend is installed")
    return max(opened, key=lambda backend: len(backend.capabilities()))  # max keeps the first of equals


def describe_protections(backend: SandboxBackend) -> str:
    """One line: the backend, the isolation properties it provides here, and those it lacks (and why)."""
    provided = sorted(backend.capabilities())
    missing = sorted(set(CAPABILITIES) - set(provided))
    reasons = getattr(backend, "reasons", {})
    line = f"sandbox: {backend.name} with {', '.join(provided) or 'no isolation'}"
    if missing:
        first = reasons.get(missing[0], "")
        line += f"; missing {', '.join(missing)}" + (f" ({first})" if first else "")
    return line
