"""Conformance suites of relayrl-algo: :class:`LossTests` for every policy loss."""

from relayrl.algo.testing.loss_tests import LossTests, ReplayBatch, make_replay_batch

__all__ = ["LossTests", "ReplayBatch", "make_replay_batch"]
