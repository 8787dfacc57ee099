"""Conformance suites of relayrl-algo: :class:`LossTests` for every policy loss,
:class:`AdvantageEstimatorTests` for every advantage estimator, :class:`CorrectionTests` for every
train/inference mismatch correction, :class:`RewardShaperTests` for every reward shaper and
:class:`MonitorTests` for every health monitor."""

from relayrl.algo.testing.estimator_tests import AdvantageEstimatorTests, CorrectionTests
from relayrl.algo.testing.loss_tests import LossTests, ReplayBatch, make_replay_batch
from relayrl.algo.testing.shaper_tests import MonitorTests, RewardShaperTests, monitor_stream, scored_groups

__all__ = ["AdvantageEstimatorTests", "CorrectionTests", "LossTests", "MonitorTests", "ReplayBatch",
           "RewardShaperTests", "make_replay_batch", "monitor_stream", "scored_groups"]
