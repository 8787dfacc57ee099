"""Hook specifications owned by relayrl-buffer (added through ``relayrl_addhooks``).

Both are registration hooks, called at start-up; they are documented in ``docs/plugins.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Kind, hookspec

if TYPE_CHECKING:
    from relayrl.buffer.admission import AdmissionPolicy
    from relayrl.buffer.config import BufferSection, PromptsSection
    from relayrl.buffer.prompts import Pick
    from relayrl.core.plugins import Registration
    from relayrl.core.wire import Group


class AdmissionPolicyFactory(Protocol):
    """Builds an :class:`~relayrl.buffer.admission.AdmissionPolicy` from the whole ``[buffer]`` section."""

    def __call__(self, config: BufferSection, /) -> AdmissionPolicy: ...


class PromptSchedulerLike(Protocol):
    """What the rollout manager draws tasks from (:class:`~relayrl.buffer.prompts.PromptScheduler`)."""

    def next(self) -> Pick: ...

    def observe(self, group: Group) -> None: ...

    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...

    def metrics(self, prefix: str = ...) -> dict[str, float]: ...


class PromptSchedulerFactory(Protocol):
    def __call__(self, tasks: Sequence[Any], config: PromptsSection | None = ..., /, *,
                 seed: int = ...) -> PromptSchedulerLike: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
ADMISSION_POLICIES: Kind[AdmissionPolicyFactory] = Kind("relayrl_buffer_admission_policies", "admission policy")
PROMPT_SCHEDULERS: Kind[PromptSchedulerFactory] = Kind("relayrl_buffer_prompt_schedulers", "prompt scheduler")


@hookspec
def relayrl_buffer_admission_policies() -> Iterable[Registration[AdmissionPolicyFactory]]:
    """Admission policies the trainer-side buffer can apply to every group before batching.

    ``name`` is what ``buffer.admission`` lists; ``factory(config)`` receives the whole
    :class:`relayrl.buffer.config.BufferSection` (a policy reads its options from
    ``config.policy_options[name]``, checked when the config loads against the ``config`` struct its
    registration declares) and returns an object with
    ``admit(group: PendingGroup, trainer_version: int) -> Admission`` that is deterministic and
    has no side effects: the buffer may evaluate the same group several times. Built in:
    ``staleness``, ``zero-variance``. Example::

        @hookimpl
        def relayrl_buffer_admission_policies():
            yield Registration("min-reward", MinRewardPolicy.from_config, "drop groups whose best reward is low")
    """


@hookspec
def relayrl_buffer_prompt_schedulers() -> Iterable[Registration[PromptSchedulerFactory]]:
    """Prompt schedulers the rollout manager can draw tasks from.

    ``name`` is what ``buffer.prompts.scheduler`` selects; ``factory(tasks, config, seed=...)``
    receives a sequence of tasks (anything with a ``task_id``, or plain id strings), the
    :class:`relayrl.buffer.config.PromptsSection` and the run seed, and returns a
    :class:`relayrl.buffer.prompts.PromptScheduler`-like object (``next()``, ``observe(group)``,
    ``state()``, ``restore(state)``). Built in: ``pass-rate``. Example::

        @hookimpl
        def relayrl_buffer_prompt_schedulers():
            yield Registration("round-robin", RoundRobin, "every task in turn, no filtering")
    """
