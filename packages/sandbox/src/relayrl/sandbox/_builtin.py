"""relayrl-sandbox's own plugin: its hookspecs, the ``process`` backend, the detectors, the task sources,
and the ``[sandbox]`` config section."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.sandbox.hookspecs import ExploitDetectorFactory, SandboxBackendFactory, TaskSourceFactory


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.sandbox import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.sandbox.config import SandboxSection

    yield Registration("sandbox", SandboxSection, "sandbox backend, limits, required isolation, tools, grading, detectors")


@hookimpl
def relayrl_sandbox_backends() -> Iterator[Registration[SandboxBackendFactory]]:
    from relayrl.sandbox.process import ProcessBackend

    yield Registration("process", ProcessBackend,
                       "unshare (net, pid, mount) + prlimit + setpriv + cgroups; read-only host, tmpfs workspace")


@hookimpl
def relayrl_sandbox_exploit_detectors() -> Iterator[Registration[ExploitDetectorFactory]]:
    from relayrl.sandbox import detectors

    for name, detector in detectors.BUILTIN.items():
        yield Registration(name, detector, (detector.__doc__ or "").strip().splitlines()[0])


@hookimpl
def relayrl_sandbox_task_sources() -> Iterator[Registration[TaskSourceFactory]]:
    from relayrl.sandbox.task_sources import DirectorySource, JsonlSource

    yield Registration("jsonl", JsonlSource, "one TaskSpec JSON object per line; paths relative to the file",
                       capabilities={"detects"})
    yield Registration("directory", DirectorySource, "one folder per task holding task.json; paths relative to it",
                       capabilities={"detects"})
