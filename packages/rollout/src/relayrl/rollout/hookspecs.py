"""Hook specifications owned by relayrl-rollout (documented in ``docs/plugins.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_rollout_engines() -> Iterable[Registration[Any]]:
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
def relayrl_rollout_routers() -> Iterable[Registration[Any]]:
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
def relayrl_rollout_harnesses() -> Iterable[Registration[Any]]:
    """Agent harnesses: how one task becomes one trajectory.

    ``factory(config)`` (a class with a ``Config`` section, like the engines' options) returns an
    object with ``async run(task, *, proxy, tools, chat, sampling, group_id, sample_index) ->
    Trajectory``. Generation must go through ``proxy`` (the token-recording proxy) and the context
    must be built from rendered and generated tokens, never re-tokenised text. Built in:
    ``coding-agent`` (multi-turn, parallel tool calls, self-compaction) and ``single-turn``.
    """


@hookspec
def relayrl_rollout_environments() -> Iterable[Registration[Any]]:
    """Environments: where tasks come from, what tools an agent gets, and how answers are graded.

    ``factory(config, *, sandbox, pm)`` (a class with a ``Config`` section for
    ``[rollout.environment_options]``; ``sandbox`` is the run's ``[sandbox]`` section) returns an
    object with ``tasks() -> list[TaskSpec]``, ``tools(task)`` (an async context manager yielding a
    ``ToolExecutor`` or None), ``async grade(task, trajectories, answers) -> list[Trajectory]`` and
    ``metrics() -> dict[str, float]``; optionally, for the supervised warm-up, ``demonstration(task)
    -> str`` (a single answer) or ``async demonstrate(*, harness, chat, tokenizer) -> list[Trajectory]``
    (multi-turn: an expert played through the run's harness and real tools; every generated token is
    trained), ``eval_tasks()`` (held-out tasks: a training task with the same id or prompt is never
    trained on), and ``alphabet`` and ``specials`` (a character tokenizer's characters
    and the strings it keeps whole). Built in: ``countdown`` (arithmetic answers graded in the
    sandbox), ``code`` (the shipped bug-fix tasks, agent tools and hidden tests in sandboxes) and
    ``code-search`` (generated repositories, search tools in sandboxes, F1 graded in a sandbox).
    """
