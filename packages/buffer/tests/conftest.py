"""Every store-backed test runs twice: on local files and on moto's S3 server on loopback."""

from __future__ import annotations

import pytest

from relayrl.core.store import open_store

# Shared fixtures (an S3 server on loopback, plugin-manager isolation) from relayrl-core's testing module.
from relayrl.core.testing.fixtures import isolated_plugins, s3_server, s3_url  # noqa: F401


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path) -> str:
    """A fresh, empty bus URL: a local directory, or a prefix on the loopback S3 server."""
    if request.param == "file":
        return f"file://{tmp_path}/bus"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def store(store_url):
    return open_store(store_url)
