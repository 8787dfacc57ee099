"""The template estimator passes relayrl's estimator conformance suite, and ``[algo] advantage`` finds it."""

from __future__ import annotations

import pytest
import torch

from relayrl.algo.config import build
from relayrl.algo.hookspecs import ADVANTAGE_ESTIMATORS
from relayrl.algo.testing import AdvantageEstimatorTests
from relayrl_template.advantage import MedianBaseline
from relayrl_template.plugin import NAME


class TestMedianBaseline(AdvantageEstimatorTests):
    @pytest.fixture
    def estimator(self):
        return MedianBaseline()


def test_registered_through_the_entry_point():
    estimator = build(ADVANTAGE_ESTIMATORS, NAME, {"scale": 2.0},
                      path="algo.advantage")
    result = estimator(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 0, 0]))
    assert torch.equal(result.advantages, torch.tensor([-2.0, 0.0, 0.0]))
