"""Hook specifications owned by relayrl-rollout (documented in ``docs/plugins.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_rollout_engines() -> Iterable[Registration[Any]]:
    """Inference engine backends, one :class:`Registration` per name.

    ``factory(model: str, **options)`` returns an engine serving the model directory ``model``:
    an :class:`relayrl.rollout.protocol.InferenceEngine` that, to take weight updates in place, is
    also a :class:`relayrl.rollout.protocol.WeightSyncTarget`. It must pass
    ``relayrl.rollout.testing.EngineTests``. Built in: ``torch``.
    """


@hookspec
def relayrl_rollout_routers() -> Iterable[Registration[Any]]:
    """Routers, one :class:`Registration` per name.

    ``factory(engines: list[InferenceEngine], **options)`` returns an ``InferenceEngine`` that
    routes each request to one of ``engines``, retries failures before the first token elsewhere,
    and raises ``EngineDied`` for failures after it (the token-recording proxy resumes those). It
    must pass ``relayrl.rollout.testing.RouterTests``. Built in: ``round-robin``, ``least-loaded``.
    """
