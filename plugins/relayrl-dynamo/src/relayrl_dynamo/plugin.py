"""The plugin module named by the ``relayrl`` entry point: the ``dynamo`` router (Dynamo is imported lazily)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl
from relayrl_dynamo.factory import DynamoRouterConfig, DynamoRouterFactory

if TYPE_CHECKING:
    from relayrl.rollout.hookspecs import RouterFactory


@hookimpl
def relayrl_rollout_routers() -> Iterator[Registration[RouterFactory]]:
    yield Registration("dynamo", DynamoRouterFactory(),
                       "NVIDIA Dynamo: engines register as instances, requests go over its TCP request plane",
                       config=DynamoRouterConfig, capabilities={"discovery"})
