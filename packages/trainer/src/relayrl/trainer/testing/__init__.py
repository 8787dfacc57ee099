"""Conformance suite of relayrl-trainer: :class:`TrainerBackendTests` for every trainer backend
(needs ``relayrl-trainer[testing]``: the suite samples its batches with relayrl-rollout's engine)."""

from relayrl.trainer.testing.backend_tests import TrainerBackendTests

__all__ = ["TrainerBackendTests"]
