"""Hook specifications owned by relayrl-buffer (added through ``relayrl_addhooks``).

Both are registration hooks, called at start-up; they are documented in ``docs/plugins.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import hookspec

if TYPE_CHECKING:
    from relayrl.core.plugins import Registration


@hookspec
def relayrl_buffer_admission_policies() -> Iterable[Registration[Any]]:
    """Admission policies the trainer-side buffer can apply to every group before batching.

    ``name`` is what ``buffer.admission`` lists; ``factory(config)`` receives the whole
    :class:`relayrl.buffer.config.BufferSection` (a third-party policy reads its options from
    ``config.policy_options[name]``) and returns an object with
    ``admit(group: PendingGroup, trainer_version: int) -> Admission`` that is deterministic and
    has no side effects: the buffer may evaluate the same group several times. Built in:
    ``staleness``, ``zero-variance``. Example::

        @hookimpl
        def relayrl_buffer_admission_policies():
            yield Registration("min-reward", MinRewardPolicy.from_config, "drop groups whose best reward is low")
    """


@hookspec
def relayrl_buffer_prompt_schedulers() -> Iterable[Registration[Any]]:
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
