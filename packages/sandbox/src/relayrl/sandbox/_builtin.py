"""relayrl-sandbox's own plugin: its hookspecs, the ``process`` backend, the detectors, the task sources,
and the ``[sandbox]`` config section."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


@hookimpl
def relayrl_addhooks(pluginmanager):
    from relayrl.sandbox import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def relayrl_core_config_sections():
    from relayrl.sandbox.config import SandboxSection

    yield Registration("sandbox", SandboxSection, "sandbox backend, limits, required isolation, tools, grading, detectors")


@hookimpl
def relayrl_sandbox_backends():
    from relayrl.sandbox.process import ProcessBackend

    yield Registration("process", ProcessBackend,
                       "unshare (net, pid, mount) + prlimit + setpriv + cgroups; read-only host, tmpfs workspace")


@hookimpl
def relayrl_sandbox_exploit_detectors():
    from relayrl.sandbox import detectors

    for name, detector in detectors.BUILTIN.items():
        yield Registration(name, detector, (detector.__doc__ or "").strip().splitlines()[0])


@hookimpl
def relayrl_sandbox_task_sources():
    from relayrl.sandbox.tasks import DirectorySource, JsonlSource

    yield Registration("jsonl", JsonlSource, "one TaskSpec JSON object per line; paths relative to the file",
                       capabilities={"detects"})
    yield Registration("directory", DirectorySource, "one folder per task holding task.json; paths relative to it",
                       capabilities={"detects"})
