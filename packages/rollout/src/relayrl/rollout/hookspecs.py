"""Hook specifications owned by relayrl-rollout (documented in ``docs/plugins.md``).

Each contract is stated once, as a Protocol: the engine's in :mod:`relayrl.rollout.protocol`, the
environment's in :mod:`relayrl.rollout.environment`, the factories' and the harness's here. A hook's
docstring says what the hook registers and points at its Protocol; it does not restate it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Kind, Registration, capabilities, hookspec
from relayrl.rollout.environment import EnvironmentFactory

if TYPE_CHECKING:
    from relayrl.core.wire import TaskSpec, Trajectory
    from relayrl.rollout.agent import ToolExecutor
    from relayrl.rollout.chat import ChatFormat
    from relayrl.rollout.protocol import InferenceEngine, SamplingParams
    from relayrl.rollout.routing import TokenRecordingProxy


class EngineFactory(Protocol):
    """Starts an :class:`~relayrl.rollout.protocol.InferenceEngine` serving the model directory ``model``.

    ``engine_id``, ``version``, ``max_batch``, ``seed`` and ``dtype`` (what the trainer publishes)
    come from the run, as keywords; ``options`` are the keys of ``[rollout] engine_options`` the user
    set, declared by the registration's ``config`` struct (an engine that declares none takes none).
    (The signature says ``*args, **options`` only so that a factory may name exactly what it takes.)"""

    def __call__(self, model: str, /, *args: Any, **options: Any) -> InferenceEngine: ...


class RouterFactory(Protocol):
    """Builds a router (itself an :class:`~relayrl.rollout.protocol.InferenceEngine`) over ``engines``;
    ``options`` are the keys of ``[rollout] router_options`` the user set, declared by the
    registration's ``config`` struct (keywords of the factory's own, as for :class:`EngineFactory`)."""

    def __call__(self, engines: list[InferenceEngine], /, *args: Any, **options: Any) -> InferenceEngine: ...


class DiscoveryRouterFactory(RouterFactory, Protocol):
    """What capability ``discovery`` promises of a router factory: engines register with the router
    themselves. Built over engines that registered already it takes ``deployment`` (the run directory,
    which scopes its namespace), ``serve=False`` and ``expect_instances``."""

    async def serve_engine(self, engine: InferenceEngine, *, deployment: str | None = ..., **options: Any) -> Any:
        """Make ``engine`` reachable through the router (each engine process awaits it); the worker."""


class Harness(Protocol):
    """How one task becomes one trajectory (an agent loop).

    Generation goes through ``proxy`` (the token-recording proxy), and the context is built from
    rendered and generated tokens, never re-tokenised text.
    """

    async def run(self, task: TaskSpec, *, proxy: TokenRecordingProxy, tools: ToolExecutor | None,
                  chat: ChatFormat, sampling: SamplingParams, group_id: str, sample_index: int) -> Trajectory:
        """One episode of ``task``: the trajectory, ungraded."""
        ...

    def compaction_markers(self) -> tuple[str, str]:
        """``(compaction_prompt, summary_header)``: how a scripted expert sees it is asked to compact,
        and where a new segment's summary starts; empty strings for a harness that never compacts."""
        ...


class HarnessFactory(Protocol):
    def __call__(self, config: Any = ..., /) -> Harness: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
ENGINES: Kind[EngineFactory] = Kind("relayrl_rollout_engines", "engine")
ROUTERS: Kind[RouterFactory] = Kind("relayrl_rollout_routers", "router")
HARNESSES: Kind[HarnessFactory] = Kind("relayrl_rollout_harnesses", "harness")
ENVIRONMENTS: Kind[EnvironmentFactory] = Kind("relayrl_rollout_environments", "environment")


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
@capabilities(discovery="engines register with the router themselves (DiscoveryRouterFactory: serve_engine)")
def relayrl_rollout_routers() -> Iterable[Registration[RouterFactory]]:
    """Routers, one :class:`Registration` per name.

    ``factory(engines: list[InferenceEngine], **options)`` returns an ``InferenceEngine`` that
    routes each request to one of ``engines``, retries failures before the first token elsewhere,
    and raises ``EngineDied`` for failures after it (the token-recording proxy resumes those). It
    must pass ``relayrl.rollout.testing.RouterTests``. Built in: ``round-robin``, ``least-loaded``.

    Capability ``discovery``: engines register with the router themselves; the factory is then a
    :class:`DiscoveryRouterFactory` (plugin: ``dynamo``).
    """


@hookspec
def relayrl_rollout_harnesses() -> Iterable[Registration[HarnessFactory]]:
    """Agent harnesses: how one task becomes one trajectory.

    ``factory(config)`` (:class:`HarnessFactory`: a class with a ``Config`` section, like the engines'
    options) returns a :class:`Harness`: that Protocol is the contract. It must pass
    ``relayrl.rollout.testing.HarnessTests``. Built in: ``coding-agent`` (multi-turn, parallel tool
    calls, self-compaction) and ``single-turn``.
    """


@hookspec
def relayrl_rollout_environments() -> Iterable[Registration[EnvironmentFactory]]:
    """Environments: where tasks come from, what tools an agent gets, and how answers are graded.

    ``factory(config, *, sandbox, pm)`` (:class:`~relayrl.rollout.environment.EnvironmentFactory`;
    ``config`` is the registration's declared ``config`` decoded from ``[rollout.environment_options]``,
    ``sandbox`` the run's ``[sandbox]`` section) returns an
    :class:`~relayrl.rollout.environment.Environment`: that Protocol is the contract. It must pass
    ``relayrl.rollout.testing.EnvironmentTests``. Built in (relayrl-environments): ``countdown``,
    ``code``, ``code-search``, ``kernels``.
    """
