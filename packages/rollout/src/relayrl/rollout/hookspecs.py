"""Hook specifications owned by relayrl-rollout (documented in ``docs/plugins.md``), and the
:class:`Environment` contract next to the hook that registers environments."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Registration, hookspec

if TYPE_CHECKING:
    from relayrl.core.wire import TaskSpec, Trajectory
    from relayrl.rollout.agent import ToolExecutor
    from relayrl.rollout.chat import ChatFormat
    from relayrl.rollout.protocol import InferenceEngine, SamplingParams
    from relayrl.rollout.routing import TokenRecordingProxy


class EngineFactory(Protocol):
    """Starts an :class:`~relayrl.rollout.protocol.InferenceEngine` serving the model directory ``model``."""

    def __call__(self, model: str, **options: Any) -> InferenceEngine: ...


class RouterFactory(Protocol):
    """Builds a router (itself an :class:`~relayrl.rollout.protocol.InferenceEngine`) over ``engines``."""

    def __call__(self, engines: list[InferenceEngine], **options: Any) -> InferenceEngine: ...


class Harness(Protocol):
    """How one task becomes one trajectory (an agent loop)."""

    async def run(self, task: TaskSpec, *, proxy: TokenRecordingProxy, tools: ToolExecutor | None,
                  chat: ChatFormat, sampling: SamplingParams, group_id: str, sample_index: int) -> Trajectory: ...

    def compaction_markers(self) -> tuple[str, str]: ...


class HarnessFactory(Protocol):
    def __call__(self, config: Any = ..., /) -> Harness: ...


class Environment(Protocol):
    """What ``relayrl_rollout_environments`` factories return: tasks, an agent's tools, and grading.

    Subclass it: the optional members below have working defaults (no held-out tasks, no
    demonstrations, no character alphabet, nothing to close), so every consumer calls them without
    probing. Built in: :class:`~relayrl.rollout.countdown.CountdownEnvironment`,
    :class:`~relayrl.rollout.environments.CodeEnvironment`,
    :class:`~relayrl.rollout.search.CodeSearchEnvironment`.
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

    def __call__(self, config: Any, /, *, sandbox: Any = ..., pm: Any = ...) -> Environment: ...


@hookspec
def relayrl_rollout_engines() -> Iterable[Registration[EngineFactory]]:
    """Inference engine backends, one :class:`Registration` per name.

    ``factory(model: str, **options)`` returns an engine serving the model directory ``model``:
    an :class:`relayrl.rollout.protocol.InferenceEngine` that, to take weight updates in place, returns
    relayrl-weight-sync's :class:`~relayrl.weight_sync.EngineAdapter` from ``weight_adapter()``
    (directly over its tensors, or a :class:`~relayrl.weight_sync.ShadowAdapter` when it is a
    :class:`~relayrl.weight_sync.WeightLoader`). Options every engine takes:
    ``engine_id``, ``version``, ``max_batch``, ``seed`` and ``dtype`` (``"float32"``, ``"bfloat16"``:
    the run's ``model.dtype``, which the trainer publishes in; weight sync is bit-exact, so the
    engine must serve exactly that dtype; absent: the engine's default). It must pass
    ``relayrl.rollout.testing.EngineTests``. Built in: ``torch``.
    """


@hookspec
def relayrl_rollout_routers() -> Iterable[Registration[RouterFactory]]:
    """Routers, one :class:`Registration` per name.

    ``factory(engines: list[InferenceEngine], **options)`` returns an ``InferenceEngine`` that
    routes each request to one of ``engines``, retries failures before the first token elsewhere,
    and raises ``EngineDied`` for failures after it (the token-recording proxy resumes those). It
    must pass ``relayrl.rollout.testing.RouterTests``. Built in: ``round-robin``, ``least-loaded``.

    Capability ``discovery`` (declared in the registration's ``capabilities``): engines register with
    the router themselves. The factory then also has ``async serve_engine(engine, *, deployment,
    **options)``, which each engine process awaits to become reachable through the router, and
    takes ``deployment`` (the run directory, which scopes its namespace), ``serve=False`` and
    ``expect_instances`` when it is built over engines that registered already (plugin: ``dynamo``).
    """


@hookspec
def relayrl_rollout_harnesses() -> Iterable[Registration[HarnessFactory]]:
    """Agent harnesses: how one task becomes one trajectory.

    ``factory(config)`` (a class with a ``Config`` section, like the engines' options) returns an
    object with ``async run(task, *, proxy, tools, chat, sampling, group_id, sample_index) ->
    Trajectory`` and ``compaction_markers() -> (compaction_prompt, summary_header)`` (how a scripted
    expert sees it is asked to compact, and where a new segment's summary starts; empty strings for
    a harness that never compacts). Generation must go through ``proxy`` (the token-recording proxy) and the context
    must be built from rendered and generated tokens, never re-tokenised text. Built in:
    ``coding-agent`` (multi-turn, parallel tool calls, self-compaction) and ``single-turn``.
    """


@hookspec
def relayrl_rollout_environments() -> Iterable[Registration[EnvironmentFactory]]:
    """Environments: where tasks come from, what tools an agent gets, and how answers are graded.

    ``factory(config, *, sandbox, pm)`` (``config``: the registration's declared ``config`` decoded
    from ``[rollout.environment_options]``; ``sandbox`` is the run's ``[sandbox]`` section) returns
    an :class:`Environment`: ``tasks()``, ``tools(task)``, ``async grade(task, trajectories,
    answers)`` and ``metrics()``; optionally (defaults in :class:`Environment`), for the supervised
    warm-up, ``demonstration(task)`` or ``async demonstrate(*, harness, chat, tokenizer)``,
    ``eval_tasks()`` (held-out tasks), ``alphabet`` and ``specials`` (a character tokenizer's
    characters and the strings it keeps whole), and ``close()``. Built in: ``countdown`` (arithmetic answers graded in the
    sandbox), ``code`` (the shipped bug-fix tasks, agent tools and hidden tests in sandboxes) and
    ``code-search`` (generated repositories, search tools in sandboxes, F1 graded in a sandbox).
    """
