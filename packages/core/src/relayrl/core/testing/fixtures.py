"""pytest fixtures for relayrl tests; enable with ``pytest_plugins = ["relayrl.core.testing.fixtures"]``.

``s3_server``
    One moto S3 server on loopback per test session, with its environment set for the session.
``s3_url``
    A fresh, empty ``s3://`` prefix on that server for one test.
``isolated_plugins``
    Resets the process-wide plugin manager before and after a test.
``builtin_plugins_only``
    Like ``isolated_plugins``, with third-party plugins filtered out (``RELAYRL_LOAD_PLUGINS=""``),
    so registries hold exactly the built-ins whatever else is installed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from relayrl.core.testing.s3server import S3Server

BUCKET = "relayrl-test"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"S3 tests need moto[server], boto3 and s3fs: {exc}")
    with S3Server() as server, server.environment():
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"


@pytest.fixture
def isolated_plugins() -> Iterator[None]:
    from relayrl.core.plugins import reset_plugin_manager

    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def builtin_plugins_only(monkeypatch) -> Iterator[None]:
    from relayrl.core.plugins import reset_plugin_manager

    monkeypatch.setenv("RELAYRL_LOAD_PLUGINS", "")
    reset_plugin_manager()
    yield
    reset_plugin_manager()
