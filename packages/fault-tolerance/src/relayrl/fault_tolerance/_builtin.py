"""relayrl-fault-tolerance's own plugin: the ``relayrl-peer`` store scheme (a peer's checkpoint directory).

Checkpoint replicas live in any relayrl store (core's ``relayrl_core_stores`` registry: a local
directory, S3, or this peer scheme), so the package adds no registry of its own.
"""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


def _peer_store(url, **options):
    from relayrl.fault_tolerance.peers import HttpPeerStore

    return HttpPeerStore.from_url(url, **options)


@hookimpl
def relayrl_core_stores():
    yield Registration("relayrl-peer", _peer_store, "a peer node's checkpoint directory over HTTP (PeerServer)")
