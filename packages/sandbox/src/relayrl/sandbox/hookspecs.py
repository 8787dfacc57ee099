"""Hook specifications owned by relayrl-sandbox (documented in ``docs/plugins.md``).

All three are registration hooks: no arguments, called at start-up, they yield
:class:`relayrl.core.plugins.Registration` records.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from relayrl.core.plugins import Registration, hookspec

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
    """Flags cheating in one graded answer (any flag makes the reward 0)."""

    def __call__(self, context: DetectionContext) -> list[CheatingFlag]: ...


class ExploitDetectorFactory(Protocol):
    def __call__(self) -> ExploitDetector: ...


class TaskSourceFactory(Protocol):
    """Reads the tasks at ``location`` (capability ``detects``: it also has ``accepts(location)``)."""

    def __call__(self, location: str | Path, /) -> Iterable[TaskSpec]: ...


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

    ``factory()`` returns a callable ``detect(context: DetectionContext) -> list[CheatingFlag]``
    over the trajectory's tool calls and results, the final diff and the task (hidden tests
    included: detectors run on the grader's side). Any flag makes the reward 0. Each detector needs
    a true-positive and a true-negative test with a scripted agent. Built in: ``test-edits``,
    ``history-access``, ``network``, ``outside-writes``, ``runner-tampering``, ``literal-special-casing``.
    """


@hookspec
def relayrl_sandbox_task_sources() -> Iterable[Registration[TaskSourceFactory]]:
    """Task sources, selected by ``[sandbox] task_source`` or guessed from a location.

    ``factory(location: str)`` returns an iterable of :class:`relayrl.core.wire.TaskSpec` whose
    relative paths are resolved against the location. Capability ``detects`` (declared in the
    registration's ``capabilities``): the factory also has ``accepts(location) -> bool``, so that
    :func:`relayrl.sandbox.task_sources.load_tasks` can pick it for a location without a name. Built in:
    ``jsonl`` (one TaskSpec per line) and ``directory`` (one folder with ``task.json`` per task).
    """
