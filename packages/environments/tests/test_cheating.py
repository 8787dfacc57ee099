"""The cheating suite on the process backend: every cheat earns 0, every gold patch 1."""

from __future__ import annotations

import pytest

from relayrl.environments.testing import GraderTests
from relayrl.sandbox.api import SandboxUnavailable
from relayrl.sandbox.process import ProcessBackend


class TestProcessBackendGrading(GraderTests):
    @pytest.fixture
    def backend(self):
        try:
            return ProcessBackend(limits=GraderTests.limits, require=[])
        except SandboxUnavailable as exc:
            pytest.skip(f"the process backend cannot start on this host: {exc}")
