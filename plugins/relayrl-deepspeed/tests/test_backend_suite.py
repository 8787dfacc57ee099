"""The DeepSpeed backend, in one process (a world of one on gloo), against relayrl-trainer's
conformance suite: the same step as the torch backend, a complete named_full_state, a checkpoint
that round-trips. Two-rank equivalence and resumes are in test_deepspeed.py."""

from __future__ import annotations

import pytest

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import OptimizerSection
from relayrl.trainer.testing import TrainerBackendTests
from relayrl_deepspeed.backend import DeepSpeedTrainer
from relayrl_deepspeed.config import DeepSpeedSection


class TestDeepSpeedBackend(TrainerBackendTests):
    """fp32, AdamW (DeepSpeed's Muon is not torch's: the bf16 + Muon configurations are compared in
    test_deepspeed.py), every ZeRO stage."""

    # DeepSpeed's CPU Adam and its partitioned reductions: the same maths in another order. An element
    # whose gradient is near zero may move up to 5% of a step (lr 1e-2) apart; on average they agree.
    weight_atol = 5e-4
    mean_atol = 1e-6

    @pytest.fixture
    def algo(self):
        return AlgoSection(optimizer=OptimizerSection(lr=1e-2, muon=False))

    @pytest.fixture(params=[1, 2, 3], ids=lambda stage: f"zero{stage}")
    def make_backend(self, request, monkeypatch):
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # read when DeepSpeed is first imported (lazily, by the backend)

        def make(model, *, algo, config, version=0):
            return DeepSpeedTrainer(model, algo=algo, config=config, version=version,
                                    deepspeed=DeepSpeedSection(zero_stage=request.param, bf16=False, muon=False))
        return make
