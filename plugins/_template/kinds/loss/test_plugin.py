"""The template loss passes relayrl's loss conformance suite, and ``[algo] loss`` finds it."""

from __future__ import annotations

import pytest

from relayrl.algo.config import build
from relayrl.algo.hookspecs import LOSSES
from relayrl.algo.testing import LossTests
from relayrl_template.loss import PolicyGradient
from relayrl_template.plugin import NAME


class TestPolicyGradient(LossTests):
    @pytest.fixture
    def loss(self):
        return PolicyGradient()


class TestPolicyGradientSequenceMean(LossTests):
    @pytest.fixture
    def loss(self):
        return PolicyGradient(PolicyGradient.Config(aggregation="seq-mean-token-mean"))


def test_registered_through_the_entry_point():
    loss = build(LOSSES, NAME, {"aggregation": "seq-mean-token-sum"}, path="algo.loss")
    assert isinstance(loss, PolicyGradient) and loss.aggregation == "seq-mean-token-sum"
