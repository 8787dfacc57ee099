"""Conformance suites of relayrl-algo: :class:`LossTests` for every policy loss,
:class:`AdvantageEstimatorTests` for every advantage estimator and :class:`CorrectionTests` for every
train/inference mismatch correction."""

from relayrl.algo.testing.estimator_tests import AdvantageEstimatorTests, CorrectionTests
from relayrl.algo.testing.loss_tests import LossTests, ReplayBatch, make_replay_batch

__all__ = ["AdvantageEstimatorTests", "CorrectionTests", "LossTests", "ReplayBatch", "make_replay_batch"]
