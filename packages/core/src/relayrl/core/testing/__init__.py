"""Conformance suites and fixtures that relayrl packages and third-party plugins test against.

* :class:`StoreTests`: every object-store backend (subclass it, override the ``store`` fixture).
* :class:`S3Server`: moto's S3 server on loopback.
* ``relayrl.core.testing.fixtures``: pytest fixtures (``s3_server``, ``s3_url``, ``isolated_plugins``).
"""

from relayrl.core.testing.s3server import S3Server
from relayrl.core.testing.store_tests import StoreTests

__all__ = ["S3Server", "StoreTests"]
