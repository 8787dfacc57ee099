"""The HTTP peer store passes the store conformance suite (atomicity, checksums, SIGKILLed writers)."""

from __future__ import annotations

import uuid

import pytest

from relayrl.core.store import open_store
from relayrl.core.testing import StoreTests
from relayrl.fault_tolerance.peers import HttpPeerStore, PeerServer


@pytest.fixture(scope="module")
def peer_server(tmp_path_factory):
    with PeerServer(tmp_path_factory.mktemp("peer")) as server:
        yield server


class TestHttpPeerStore(StoreTests):
    large_object_bytes = 16 * 1024 * 1024
    kill_iterations = 10

    @pytest.fixture
    def store(self, peer_server):
        return open_store(f"{peer_server.url}/{uuid.uuid4().hex}")

    def test_is_a_peer_store(self, store):
        assert isinstance(store, HttpPeerStore)


def test_bad_peer_urls_are_refused():
    from relayrl.core.errors import StoreError

    with pytest.raises(StoreError, match="relayrl-peer://HOST:PORT/prefix"):
        HttpPeerStore("relayrl-peer://nohost")
