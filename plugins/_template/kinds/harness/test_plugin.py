"""The template harness passes relayrl's harness conformance suite, and ``[rollout] harness`` finds it."""

from __future__ import annotations

import pytest

from relayrl.core.config import load_config
from relayrl.rollout.config import build_harness
from relayrl.rollout.testing import HarnessTests
from relayrl_template.harness import ThinkThenAnswer
from relayrl_template.plugin import NAME


class TestThinkThenAnswer(HarnessTests):
    @pytest.fixture
    def harness(self):
        return ThinkThenAnswer()


def test_registered_through_the_entry_point():
    config = load_config({"rollout": {"harness": NAME, "harness_options": {"answer_tokens": 8}}})
    harness = build_harness(config.rollout)
    assert isinstance(harness, ThinkThenAnswer) and harness.config.answer_tokens == 8
