"""pytest fixtures for tests that need a real sandbox backend; import them into a ``conftest.py``::

    from relayrl.sandbox.testing.fixtures import backend  # noqa: F401
"""

from __future__ import annotations

import pytest

from relayrl.sandbox.api import Limits, SandboxBackend, SandboxUnavailable

__all__ = ["backend"]


@pytest.fixture
def backend() -> SandboxBackend:
    """A process backend with whatever isolation this host allows (tests needing more skip by capability)."""
    from relayrl.sandbox.process import ProcessBackend

    try:
        return ProcessBackend(limits=Limits(wall_time_s=30, cpu_time_s=20, memory_bytes=512 * 1024**2,
                                            disk_bytes=64 * 1024**2), require=[])
    except SandboxUnavailable as exc:  # network-none is implied by the default network = "none"
        pytest.skip(f"the process backend cannot start on this host: {exc}")
