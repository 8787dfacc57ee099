"""Hook specifications owned by relayrl-fault-tolerance (documented in ``docs/plugins.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relayrl.core.plugins import Registration, hookspec


@hookspec
def relayrl_fault_tolerance_checkpoint_stores() -> Iterable[Registration[Any]]:
    """Where checkpoint replicas can live, one :class:`Registration` per kind.

    ``factory(url, **options)`` returns a :class:`relayrl.core.store.Store` that holds checkpoint
    shards and commit records (it must pass ``relayrl.core.testing.StoreTests``); the checkpointer
    writes the local copy and every peer replica through such stores. Built in: ``local`` (a
    directory on the node) and ``peer-http`` (a peer node's ``PeerServer`` over HTTP).
    """


@hookspec
def relayrl_fault_tolerance_membership() -> Iterable[Registration[Any]]:
    """Membership services for elastic data parallelism, one :class:`Registration` per kind.

    ``factory(store, **options)`` returns an object with ``beat(member_id)``, ``leave(member_id)``,
    ``alive() -> list[str]`` (members whose heartbeat is younger than ``ttl_s``), ``view() -> View |
    None`` and ``propose(members, *, after=None) -> View | None`` (publish the next generation), and
    a ``ttl_s`` attribute; see :mod:`relayrl.fault_tolerance.membership`. Built in: ``store`` (heartbeats
    and views as objects in any relayrl store). An etcd or Kubernetes lease service fits the same shape.
    """
