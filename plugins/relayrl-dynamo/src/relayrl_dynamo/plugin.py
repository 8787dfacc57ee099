"""The plugin module named by the ``relayrl`` entry point: the ``dynamo`` router (Dynamo is imported lazily)."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl
from relayrl_dynamo.factory import DynamoRouterFactory


@hookimpl
def relayrl_rollout_routers():
    yield Registration("dynamo", DynamoRouterFactory(),
                       "NVIDIA Dynamo: engines register as instances, requests go over its TCP request plane",
                       capabilities={"discovery"})
