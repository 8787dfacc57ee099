"""Every built-in harness passes the conformance suite a plugin passes (the built-in environments are
relayrl-environments': its tests run them through ``EnvironmentTests``)."""

from __future__ import annotations

import pytest

from relayrl.rollout.agent import AgentConfig, CodingAgent, SingleTurn
from relayrl.rollout.testing import HarnessTests


class TestCodingAgent(HarnessTests):
    @pytest.fixture
    def harness(self):
        return CodingAgent(AgentConfig(system_prompt="s"))


class TestSingleTurn(HarnessTests):
    @pytest.fixture
    def harness(self):
        return SingleTurn()
