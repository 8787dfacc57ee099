"""Conformance suites of relayrl-rollout: :class:`EngineTests` and :class:`RouterTests`, and tiny models."""

from relayrl.rollout.testing.engine_tests import EngineTests
from relayrl.rollout.testing.models import save_tiny_model, tiny_llama
from relayrl.rollout.testing.router_tests import RouterTests

__all__ = ["EngineTests", "RouterTests", "save_tiny_model", "tiny_llama"]
