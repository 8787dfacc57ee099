"""The template correction passes relayrl's correction conformance suite, and ``[algo] correction`` finds it."""

from __future__ import annotations

import pytest

from relayrl.algo.config import build
from relayrl.algo.hookspecs import MISMATCH_CORRECTIONS
from relayrl.algo.testing import CorrectionTests
from relayrl.core.config import ConfigError
from relayrl_template.correction import SoftCap
from relayrl_template.plugin import NAME


class TestSoftCap(CorrectionTests):
    @pytest.fixture
    def correction(self):
        return SoftCap()


def test_registered_through_the_entry_point_and_its_options_checked():
    assert isinstance(build(MISMATCH_CORRECTIONS, NAME, {"cap": 3.0},
                            path="algo.correction"), SoftCap)
    with pytest.raises(ConfigError, match="algo.correction_options.cap: must be > 0"):
        build(MISMATCH_CORRECTIONS, NAME, {"cap": 0.0}, path="algo.correction")
