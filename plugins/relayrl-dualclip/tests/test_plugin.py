"""The dual-clip loss passes relayrl's loss conformance suite and is discoverable by name."""

from __future__ import annotations

import pytest
import torch

from relayrl.algo.config import build
from relayrl.algo.hookspecs import LOSSES
from relayrl.algo.losses import LossInputs
from relayrl.algo.testing import LossTests
from relayrl.core.config import ConfigError
from relayrl_dualclip.loss import DualClipPPO
from relayrl_dualclip.plugin import NAME


class TestDualClip(LossTests):
    @pytest.fixture
    def loss(self):
        return DualClipPPO()


def test_negative_advantage_with_a_huge_ratio_is_bounded_by_c():
    logprobs = torch.log(torch.tensor([[0.5]])).requires_grad_()
    inputs = LossInputs(logprobs=logprobs, old_logprobs=torch.log(torch.tensor([[0.1]])),
                        advantages=torch.tensor([-1.0]), mask=torch.ones(1, 1))
    output = DualClipPPO()(inputs)
    # ratio 5: PPO-clip gives -min(-5, -1.28) = 5; dual-clip bounds it at c * |A| = 3.
    assert output.loss.item() == pytest.approx(3.0)
    output.loss.backward()
    assert logprobs.grad.item() == 0.0
    assert output.metrics["loss/dual_clip_fraction"] == 1.0


def test_registered_through_the_entry_point_and_options_validated():
    assert LOSSES.registrations()[NAME].plugin == "relayrl-dualclip"
    loss = build(LOSSES, NAME, {"clip_ratio_c": 2.5}, path="algo.loss")
    assert isinstance(loss, DualClipPPO) and loss.config.clip_ratio_c == 2.5
    with pytest.raises(ConfigError, match="algo.loss_options.clip_ratio_c: must be > 1"):
        build(LOSSES, NAME, {"clip_ratio_c": 0.5}, path="algo.loss")
