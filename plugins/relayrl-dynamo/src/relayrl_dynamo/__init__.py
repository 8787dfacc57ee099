"""relayrl-dynamo: NVIDIA Dynamo as a relayrl router (``[rollout] router = "dynamo"``).

Engines register as instances of one Dynamo endpoint (:mod:`relayrl_dynamo.worker`); the router
(:mod:`relayrl_dynamo.router`) discovers them and sends each request over Dynamo's TCP request
plane. Needs only ``ai-dynamo-runtime`` (not the full ``ai-dynamo``). Importing this package does not
import Dynamo.
"""
