from __future__ import annotations

import pytest

from relayrl.rollout.testing.models import save_tiny_model
from relayrl.rollout.testing.servers import EngineServer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def shared_engine_server(tiny_model_dir):
    """One engine server for a whole test module (start-up costs a couple of seconds)."""
    server = EngineServer(tiny_model_dir, "http-engine")
    yield server
    server.stop()


@pytest.fixture
def engine_server_factory(tiny_model_dir):
    servers = []

    def start(engine_id: str, *extra_args: str) -> EngineServer:
        server = EngineServer(tiny_model_dir, engine_id, *extra_args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
