"""Conformance suites of relayrl-rollout: :class:`EngineTests` (and :class:`MoEEngineTests`), :class:`RouterTests`,
:class:`EnvironmentTests` and :class:`HarnessTests`, and tiny models."""

from relayrl.rollout.testing.engine_tests import EngineTests, MoEEngineTests
from relayrl.rollout.testing.environment_tests import EnvironmentTests, HarnessTests
from relayrl.rollout.testing.models import save_tiny_model, tiny_llama, tiny_moe
from relayrl.rollout.testing.router_tests import RouterTests

__all__ = ["EngineTests", "EnvironmentTests", "HarnessTests", "MoEEngineTests", "RouterTests", "save_tiny_model",
           "tiny_llama", "tiny_moe"]
