"""What an environment is and what it is built from: the :class:`Environment` contract and the helpers
every environment uses.

relayrl-rollout runs environments and imports none: the built-in ones (countdown, code, code-search,
kernels) are in relayrl-environments, a plugin's in its own distribution, and all of them register
through ``relayrl_rollout_environments`` (:mod:`relayrl.rollout.hookspecs`) and build on this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec, Trajectory

if TYPE_CHECKING:
    from relayrl.rollout.agent import ToolExecutor

__all__ = ["Environment", "EnvironmentFactory", "final_text", "no_tools", "with_rewards"]


class Environment(Protocol):
    """What ``relayrl_rollout_environments`` factories return: tasks, an agent's tools, and grading.

    Subclass it: the optional members below have working defaults (no held-out tasks, no
    demonstrations, no character alphabet, nothing to close), so every consumer calls them without
    probing. The built-in ones live in relayrl-environments (:mod:`relayrl.environments`); a plugin's
    must pass :class:`relayrl.rollout.testing.EnvironmentTests`.
    """

    alphabet: str | None = None
    """The characters a fresh model's character tokenizer covers; None: the environment has no alphabet."""
    specials: Sequence[str] = ()
    """Strings that tokenizer keeps whole (tool-call markup, frequent code)."""

    def tasks(self) -> list[TaskSpec]:
        """The training tasks (held-out ones are removed from them by ``split_tasks``)."""
        raise NotImplementedError

    def tools(self, task: TaskSpec) -> AbstractAsyncContextManager[ToolExecutor | None]:
        """For one trajectory: an async context manager yielding the agent's tools, or None (no tools)."""
        raise NotImplementedError

    async def grade(self, task: TaskSpec, trajectories: Sequence[Trajectory], answers: Sequence[str]) -> list[Trajectory]:
        """The trajectories with rewards filled in (graded in a sandbox, never from text on the host);
        ``answers`` are each episode's ``ToolExecutor.final_answer()``."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Counters for the run's metrics (sandbox calls, graded answers ...)."""
        return {}

    def eval_tasks(self) -> list[TaskSpec]:
        """Held-out tasks for ``relayrl eval`` and ``[eval]``: a training task with the same id or
        prompt is never trained on."""
        return []

    def demonstration(self, task: TaskSpec) -> str | None:
        """For the supervised warm-up: one reference answer to ``task``; None: no demonstrations."""
        return None

    async def demonstrate(self, *, harness: Any, chat: Any, tokenizer: Any) -> list[Trajectory] | None:
        """For the supervised warm-up: multi-turn expert trajectories played through the run's harness
        and real tools (every generated token is trained); None: single answers from
        :meth:`demonstration`, if any."""
        return None

    def close(self) -> None:
        """Release what the environment holds (sandbox backends, graders)."""


class EnvironmentFactory(Protocol):
    """Builds an :class:`Environment` from its declared config, the run's ``[sandbox]`` section and the
    plugin manager."""

    def __call__(self, config: Any, /, *, sandbox: Any = ..., pm: PluginManager | None = ...) -> Environment: ...


@contextlib.asynccontextmanager
async def no_tools(task: TaskSpec) -> AsyncIterator[None]:
    """The tools of an environment whose agents use none (single-turn answers)."""
    yield None


def with_rewards(trajectory: Trajectory, reward: float, **components: float) -> Trajectory:
    """``trajectory`` with ``reward`` and named components set (what ``Environment.grade`` returns)."""
    return msgspec.structs.replace(trajectory, reward=reward,
                                   reward_components={**trajectory.reward_components, **components})


def final_text(trajectory: Trajectory) -> str:
    """The text of the trajectory's last assistant turn (empty when there is none)."""
    for segment in reversed(trajectory.segments):
        for turn in reversed(segment.turns):
            if turn.role == "assistant":
                return turn.text or ""
    return ""
