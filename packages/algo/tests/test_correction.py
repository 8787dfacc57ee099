"""Mismatch corrections and metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from relayrl.algo.config import build
from relayrl.algo.correction import (
    CorrectionResult,
    GeometricMask,
    MismatchInputs,
    NoCorrection,
    SequenceMask,
    TokenMask,
    TruncatedIS,
    mismatch_metrics,
)
from relayrl.algo.hookspecs import MISMATCH_CORRECTIONS
from relayrl.algo.testing import CorrectionTests
from relayrl.core.plugins import Registration, create_plugin_manager, hookimpl


def inputs(staleness=None) -> MismatchInputs:
    # rho = pi_old / mu = [0.5 / 0.4, 0.2 / 0.4] = [1.25, 0.5]; a third, padded token is ignored.
    return MismatchInputs(old_logprobs=torch.log(torch.tensor([[0.5, 0.2, 0.9]])),
                          behavior_logprobs=torch.log(torch.tensor([[0.4, 0.4, 0.1]])),
                          mask=torch.tensor([[1.0, 1.0, 0.0]]), staleness=staleness)


def test_metrics_by_hand():
    metrics = mismatch_metrics(inputs(torch.tensor([3])))
    k1 = -(math.log(1.25) + math.log(0.5)) / 2
    k3 = ((1.25 - 1 - math.log(1.25)) + (0.5 - 1 - math.log(0.5))) / 2
    assert metrics["mismatch/kl_k1"] == pytest.approx(k1, rel=1e-5)
    assert metrics["mismatch/kl_k3"] == pytest.approx(k3, rel=1e-5)
    assert metrics["mismatch/ratio_mean"] == pytest.approx(0.875, rel=1e-6)
    assert metrics["mismatch/ratio_min"] == pytest.approx(0.5) and metrics["mismatch/ratio_max"] == pytest.approx(1.25)
    assert metrics["staleness/max"] == 3.0


def weights(result: CorrectionResult) -> list[float]:
    return [round(value, 6) for value in result.weights[0, :2].tolist()]


def test_none_and_truncated():
    assert weights(NoCorrection()(inputs())) == [1.0, 1.0]
    result = TruncatedIS(TruncatedIS.Config(cap=1.1))(inputs())
    assert weights(result) == [1.1, 0.5]
    assert result.metrics["mismatch/truncated_fraction"] == 0.5
    assert result.mask.tolist() == [[1.0, 1.0, 0.0]]


def test_token_mask():
    result = TokenMask(TokenMask.Config(lower=0.8, upper=2.0))(inputs())
    assert weights(result) == [1.25, 0.0]
    assert result.mask.tolist() == [[1.0, 0.0, 0.0]]
    assert result.metrics["mismatch/masked_fraction"] == 0.5
    assert weights(TokenMask(TokenMask.Config(lower=0.8, upper=2.0, reweight=False))(inputs())) == [1.0, 0.0]


def test_sequence_mask_on_the_product_ratio():
    kept = SequenceMask(SequenceMask.Config(lower=0.5, upper=2.0))(inputs())
    assert weights(kept) == [0.625, 0.625]
    dropped = SequenceMask(SequenceMask.Config(lower=0.7, upper=2.0))(inputs())
    assert weights(dropped) == [0.0, 0.0] and dropped.mask.sum() == 0
    assert dropped.metrics["mismatch/masked_fraction"] == 1.0


def test_geometric_mask_on_the_geometric_mean():
    # geometric mean of [1.25, 0.5] = 0.7906
    assert GeometricMask()(inputs()).mask.sum() == 0  # default band [0.9, 1.1]
    kept = GeometricMask(GeometricMask.Config(lower=0.75, upper=1.1, cap=1.2))(inputs())
    assert weights(kept) == [1.2, 0.5]
    assert kept.metrics["mismatch/truncated_fraction"] == 0.5


def test_weights_are_detached():
    data = inputs()
    data.old_logprobs.requires_grad_()
    assert not TruncatedIS()(data).weights.requires_grad


class DropStale:
    """A plugin correction that uses staleness: sequences older than max_lag are masked."""

    from relayrl.core.config import Section

    class Config(Section, kw_only=True):
        max_lag: int = 2

    def __init__(self, config):
        self.config = config

    def __call__(self, data: MismatchInputs) -> CorrectionResult:
        keep = (data.staleness <= self.config.max_lag).float().unsqueeze(1).expand_as(data.mask)
        return CorrectionResult(torch.ones_like(keep), data.mask * keep, {})


class StalenessPlugin:
    @hookimpl
    def relayrl_algo_mismatch_corrections(self):
        yield Registration("drop-stale", DropStale, "mask sequences that lag too far", config=DropStale.Config)


def test_a_plugin_correction_can_depend_on_staleness():
    pm = create_plugin_manager(plugins=[("stale", StalenessPlugin())])
    correction = build(MISMATCH_CORRECTIONS, "drop-stale", {"max_lag": 1}, pm=pm)
    two = MismatchInputs(old_logprobs=torch.zeros(2, 2), behavior_logprobs=torch.zeros(2, 2), mask=torch.ones(2, 2),
                         staleness=torch.tensor([0, 3]))
    assert correction(two).mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]


class TestEveryBuiltinCorrection(CorrectionTests):
    """Every registered correction, with its default options, passes the suite a plugin passes."""

    @pytest.fixture(params=["none", "truncated", "token-mask", "sequence-mask", "geometric-mask"])
    def correction(self, request):
        return build(MISMATCH_CORRECTIONS, request.param, path="algo.correction")
