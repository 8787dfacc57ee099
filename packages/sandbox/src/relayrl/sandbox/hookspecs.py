"""Hook specifications owned by relayrl-sandbox (documented in ``docs/plugins.md``).

All three are registration hooks: no arguments, called at start-up, they yield
:class:`relayrl.core.plugins.Registration` records.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from relayrl.core.plugins import Kind, Registration, capabilities, hookspec

if TYPE_CHECKING:
    from relayrl.core.wire import CheatingFlag, TaskSpec
    from relayrl.sandbox.api import Limits, SandboxBackend
    from relayrl.sandbox.detectors import DetectionContext


class SandboxBackendFactory(Protocol):
    """Opens a :class:`~relayrl.sandbox.api.SandboxBackend` (refusing, with ``SandboxUnavailable``, what the
    host cannot provide)."""

    def __call__(self, *, limits: Limits | None = ..., require: Iterable[str] = ..., network: str = ...,
                 root: str | None = ..., hide_paths: Iterable[str] = ...,
                 expose_paths: Iterable[str] = ...) -> SandboxBackend: ...


class ExploitDetector(Protocol):
    """Flags cheating in one graded answer (any flag makes the reward 0; attempts count, not only successes).

    ``context`` holds every tool call with its result, segment and turn, the final diff, the task, its
    hidden tests and the reference-artifact globs. A pure function of it: the same context, the same
    flags, the context untouched, no exception on odd input; each flag names the detector and its
    evidence.
    """

    def __call__(self, context: DetectionContext) -> list[CheatingFlag]: ...


class ExploitDetectorFactory(Protocol):
    def __call__(self) -> ExploitDetector: ...


class TaskSourceFactory(Protocol):
    """Reads the tasks at ``location`` in a stable order, relative paths (workspace, hidden tests, a gold
    patch given as ``@file``) resolved against it; a missing or malformed location is a
    :class:`~relayrl.sandbox.api.SandboxError` naming it. Capability ``detects``: it also has a static
    ``accepts(location) -> bool``."""

    def __call__(self, location: str | Path, /) -> Iterable[TaskSpec]: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
SANDBOX_BACKENDS: Kind[SandboxBackendFactory] = Kind("relayrl_sandbox_backends", "sandbox backend")
EXPLOIT_DETECTORS: Kind[ExploitDetectorFactory] = Kind("relayrl_sandbox_exploit_detectors", "exploit detector")
TASK_SOURCES: Kind[TaskSourceFactory] = Kind("relayrl_sandbox_task_sources", "task source")


@hookspec
def relayrl_sandbox_backends() -> Iterable[Registration[SandboxBackendFactory]]:
    """Sandbox backends, selected by ``[sandbox] backend = NAME``.

    ``factory(*, limits: Limits, require: Iterable[str], network: str, root: str | None, hide_paths: list[str],
    expose_paths: list[str])`` returns a
    :class:`relayrl.sandbox.api.SandboxBackend`. It must refuse to start (raise
    :class:`relayrl.sandbox.api.SandboxUnavailable`) when the host cannot provide a required
    capability, and pass ``relayrl.sandbox.testing.SandboxTests``. Built in: ``process``.
    Example::

        @hookimpl
        def relayrl_sandbox_backends():
            yield Registration("firecracker", FirecrackerBackend, "one microVM per sandbox")
    """


@hookspec
def relayrl_sandbox_exploit_detectors() -> Iterable[Registration[ExploitDetectorFactory]]:
    """Exploit detectors, enabled by name in ``[sandbox] detectors``.

    The contract is :class:`ExploitDetectorFactory` / :class:`ExploitDetector` (detectors run on the
    grader's side, hidden tests included; any flag makes the reward 0); a detector passes
    ``relayrl.sandbox.testing.ExploitDetectorTests``. Built in: ``test-edits``,
    ``history-access``, ``network``, ``outside-writes``, ``runner-tampering``, ``literal-special-casing``.
    """


class DetectingTaskSourceFactory(TaskSourceFactory, Protocol):
    """What capability ``detects`` promises of a task source: it recognises its own locations."""

    @staticmethod
    def accepts(location: str | Path, /) -> bool:
        """Whether ``location`` is this source's (so :func:`~relayrl.sandbox.task_sources.load_tasks`
        picks it for a location without a name)."""


@hookspec
@capabilities(detects="the source recognises its own locations (DetectingTaskSourceFactory: accepts)")
def relayrl_sandbox_task_sources() -> Iterable[Registration[TaskSourceFactory]]:
    """Task sources, selected by ``[sandbox] task_source`` or guessed from a location.

    The contract is :class:`TaskSourceFactory` (capability ``detects``: it also has
    ``accepts(location) -> bool``, so that :func:`relayrl.sandbox.task_sources.load_tasks` can pick it
    for a location without a name); a source passes ``relayrl.sandbox.testing.TaskSourceTests``. Built in:
    ``jsonl`` (one TaskSpec per line) and ``directory`` (one folder with ``task.json`` per task).
    """
