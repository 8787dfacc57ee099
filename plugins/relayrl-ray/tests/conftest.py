"""A real multi-node Ray cluster on this machine, in the test's own network namespace."""

from __future__ import annotations

import os
import socket

import pytest

ray = pytest.importorskip("ray", reason="needs Ray (pip install ./plugins/relayrl-ray)")


def only_loopback() -> bool:
    """True inside a network namespace with no interface but ``lo``: Ray then advertises 127.0.0.1
    for every node (outside one it advertises the machine's address, even when told otherwise)."""
    return {name for _, name in socket.if_nameindex()} <= {"lo"}  # (sysfs may show the host's)


@pytest.fixture(scope="session")
def cluster():
    """A head node labelled ``trainer`` and two worker nodes labelled ``engine`` and ``rollout``."""
    if not only_loopback():
        pytest.skip("Ray's nodes would advertise this machine's network address: run these tests in a network "
                    "namespace of their own (nox -s ray does: unshare --net, then ip link set lo up)")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trainer": 2}})
    nodes = {"trainer": made.head_node,
             "engine": made.add_node(num_cpus=2, resources={"engine": 1}),
             "rollout": made.add_node(num_cpus=2, resources={"rollout": 1})}
    made.wait_for_nodes()
    made.nodes_by_label = nodes
    try:
        yield made
    finally:
        made.shutdown()
