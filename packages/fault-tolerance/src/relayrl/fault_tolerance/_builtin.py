"""relayrl-fault-tolerance's own plugin: its hookspecs, the peer store scheme and checkpoint stores."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


@hookimpl
def relayrl_addhooks(pluginmanager):
    from relayrl.fault_tolerance import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _peer_store(url, **options):
    from relayrl.fault_tolerance.peers import HttpPeerStore

    return HttpPeerStore.from_url(url, **options)


def _local_store(url, **options):
    from relayrl.core.store import LocalStore

    return LocalStore.from_url(url, **options)


@hookimpl
def relayrl_core_stores():
    yield Registration("relayrl-peer", _peer_store, "a peer node's checkpoint directory over HTTP (PeerServer)")


@hookimpl
def relayrl_fault_tolerance_checkpoint_stores():
    yield Registration("local", _local_store, "a directory on this node's disk")
    yield Registration("peer-http", _peer_store, "a peer node's PeerServer (relayrl-peer://host:port/prefix)")


@hookimpl
def relayrl_fault_tolerance_membership():
    from relayrl.fault_tolerance.membership import StoreMembership

    yield Registration("store", StoreMembership, "heartbeats and generation views as objects in a relayrl store")
