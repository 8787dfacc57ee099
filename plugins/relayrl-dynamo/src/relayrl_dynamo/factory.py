"""The ``dynamo`` router registration: a router factory whose engines register themselves.

``factory(engines, **options)`` builds a :class:`~relayrl_dynamo.router.DynamoRouter`. Its options
(:class:`DynamoRouterConfig`, what ``[rollout] router_options`` may hold) are the router's
(``policy``, ``retries``, ``down_for_s``, ``start_timeout_s``) and :class:`DynamoSettings` fields
(``namespace``, ``discovery``, ``discovery_dir``, ``etcd_endpoints``, ``host``).

The registration declares the ``discovery`` capability: engines register with the router
themselves. Each engine process calls ``await factory.serve_engine(engine, ...)`` (it becomes a
Dynamo instance), and the rollout process builds the router with ``serve=False``. Both
pass ``deployment`` (the run directory), from which the namespace and the ``file`` discovery
directory of the run derive unless the options set them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any, Literal

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager
from relayrl.rollout.protocol import InferenceEngine
from relayrl_dynamo.runtime import DynamoSettings

__all__ = ["DynamoRouterConfig", "DynamoRouterFactory", "settings_from_options"]


class DynamoRouterConfig(Section):
    """``[rollout] router_options`` of the ``dynamo`` router. Only the keys set are passed: the
    namespace and the ``file`` discovery directory of a run derive from its run directory unless set."""

    policy: Literal["round-robin", "random", "sticky"] = "round-robin"
    """How an instance is picked (``sticky``: every turn of a trajectory to the same one, for its prefix cache)."""
    retries: int = 2
    """Other instances a request is retried on when one fails before the first token."""
    down_for_s: float = 2.0
    """How long a failed instance is skipped."""
    start_timeout_s: float = 60.0
    """How long the router waits for the instances it expects to register."""
    namespace: str = "relayrl"
    """Dynamo namespace (``relayrl run``: one per run, from the run directory)."""
    component: str = "engine"
    endpoint: str = "generate"
    discovery: Literal["file", "mem", "etcd"] = "file"
    """Where instances register: a shared directory, one process's memory, or etcd (production)."""
    discovery_dir: str = ""
    """``file`` discovery's shared directory (``relayrl run``: ``RUN_DIR/dynamo``)."""
    etcd_endpoints: str = "http://127.0.0.1:2379"
    host: str = "127.0.0.1"
    """The address this process's TCP request plane advertises."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.retries < 0 or self.down_for_s < 0 or self.start_timeout_s <= 0:
            raise ConfigError(f"{path}: retries and down_for_s must be at least 0 and start_timeout_s above 0")
        if not self.namespace:
            raise ConfigError(f"{path}.namespace: must not be empty")

_SETTINGS_FIELDS = {field.name for field in dataclasses.fields(DynamoSettings)}


def settings_from_options(options: dict[str, Any], deployment: str | None) -> DynamoSettings | None:
    """Pop the :class:`DynamoSettings` fields out of ``options``; derive per-deployment defaults."""
    given = {key: options.pop(key) for key in list(options) if key in _SETTINGS_FIELDS}
    if deployment:
        digest = hashlib.sha256(os.path.abspath(deployment).encode()).hexdigest()[:12]
        given.setdefault("namespace", f"relayrl-{digest}")
        if given.get("discovery", "file") == "file":
            given.setdefault("discovery_dir", os.path.join(deployment, "dynamo"))
    if not given:
        return None  # an isolated in-process deployment
    return DynamoSettings(**given).resolved()


class DynamoRouterFactory:
    """Builds Dynamo routers; serves engines as Dynamo instances (see the module docstring)."""

    def __call__(self, engines: Sequence[InferenceEngine], *, deployment: str | None = None, **options: Any) -> Any:
        from relayrl_dynamo.router import DynamoRouter

        options = dict(options)
        settings = settings_from_options(options, deployment)
        return DynamoRouter(engines, settings=settings, **options)

    async def serve_engine(self, engine: InferenceEngine, *, deployment: str | None = None, **options: Any) -> Any:
        """Register ``engine`` as an instance of the deployment's endpoint; returns the started worker."""
        from relayrl_dynamo.worker import EngineWorker

        options = dict(options)
        settings = settings_from_options(options, deployment) or DynamoSettings().resolved()
        worker = EngineWorker(engine, settings)
        await worker.start()
        return worker
