"""Hook specifications owned by relayrl-sandbox (documented in ``docs/plugins.md``).

All three are registration hooks: no arguments, called at start-up, they yield
:class:`relayrl.core.plugins.Registration` records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_sandbox_backends() -> Iterable[Registration[Any]]:
    """Sandbox backends, selected by ``[sandbox] backend = NAME``.

    ``factory(*, limits: Limits, require: Iterable[str], network: str, root: str | None, hide_paths: list[str])`` returns a
    :class:`relayrl.sandbox.api.SandboxBackend`. It must refuse to start (raise
    :class:`relayrl.sandbox.api.SandboxUnavailable`) when the host cannot provide a required
    capability, and pass ``relayrl.sandbox.testing.SandboxTests``. Built in: ``process``.
    Example::

        @hookimpl
        def relayrl_sandbox_backends():
            yield Registration("firecracker", FirecrackerBackend, "one microVM per sandbox")
    """


@hookspec
def relayrl_sandbox_exploit_detectors() -> Iterable[Registration[Any]]:
    """Exploit detectors, enabled by name in ``[sandbox] detectors``.

    ``factory()`` returns a callable ``detect(context: DetectionContext) -> list[CheatingFlag]``
    over the trajectory's tool calls and results, the final diff and the task (hidden tests
    included: detectors run on the grader's side). Any flag makes the reward 0. Each detector needs
    a true-positive and a true-negative test with a scripted agent. Built in: ``test-edits``,
    ``history-access``, ``network``, ``outside-writes``, ``runner-tampering``, ``literal-special-casing``.
    """


@hookspec
def relayrl_sandbox_task_sources() -> Iterable[Registration[Any]]:
    """Task sources, selected by ``[sandbox] task_source`` or guessed from a location.

    ``factory(location: str)`` returns an iterable of :class:`relayrl.core.wire.TaskSpec` whose
    relative paths are resolved against the location. Capability ``detects`` (declared in the
    registration's ``capabilities``): the factory also has ``accepts(location) -> bool``, so that
    :func:`relayrl.sandbox.tasks.load_tasks` can pick it for a location without a name. Built in:
    ``jsonl`` (one TaskSpec per line) and ``directory`` (one folder with ``task.json`` per task).
    """
