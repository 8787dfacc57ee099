"""The DeepSpeed config the sections produce, and [deepspeed] validation (no processes needed)."""

from __future__ import annotations

import pytest

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import OptimizerSection
from relayrl.core.config import ConfigError, load_config
from relayrl.trainer.config import TrainerSection
from relayrl_deepspeed.backend import deepspeed_config
from relayrl_deepspeed.config import DeepSpeedSection


def test_muon_zero3_config():
    config = deepspeed_config(AlgoSection(optimizer=OptimizerSection(lr=2e-6, muon_lr=0.02)), TrainerSection(grad_clip=0.5),
                              DeepSpeedSection(zero_stage=3, offload_optimizer=True), use_muon=True)
    assert config["optimizer"]["type"] == "Muon"
    assert config["optimizer"]["params"]["muon_lr"] == 0.02 and config["optimizer"]["params"]["adam_lr"] == 2e-6
    # The AdamW half is torch's AdamW, whose bias correction is a function of the step in its state; DeepSpeed's
    # fused Adam keeps beta^t as a running product that a restored checkpoint does not reproduce bit for bit
    # (integration/test_deterministic_restarts.py resumes ZeRO-1/2 with Muon and bf16 bitwise).
    assert config["optimizer"]["params"]["torch_adam"] is True
    assert config["zero_optimization"] == {"stage": 3, "reduce_scatter": False, "offload_optimizer": {"device": "cpu"}}
    assert config["gradient_clipping"] == 0.5 and config["gradient_accumulation_steps"] == 1
    assert config["bf16"] == {"enabled": True}


def test_adamw_config_uses_torch_adam():
    config = deepspeed_config(AlgoSection(), TrainerSection(), DeepSpeedSection(zero_stage=1, bf16=False), use_muon=False)
    assert config["optimizer"]["type"] == "AdamW" and config["optimizer"]["params"]["torch_adam"] is True
    assert config["zero_optimization"] == {"stage": 1}


def test_section_registered_and_validated():
    config = load_config({"deepspeed": {"zero_stage": 3}, "trainer": {"backend": "deepspeed"},
                          "model": {"dtype": "bfloat16"}})
    assert config.deepspeed.zero_stage == 3
    two_ranks = {"trainer": {"backend": "deepspeed", "ranks": 2}, "deepspeed": {"bf16": False}}
    assert load_config(two_ranks).trainer.ranks == 2  # a data-parallel backend
    # ZeRO shards the model and optimiser over the ranks: the group cannot shrink under it (one line says so).
    with pytest.raises(ConfigError, match="trainer.elastic: backend 'deepspeed' cannot change its number of ranks"):
        load_config({**two_ranks, "trainer": {**two_ranks["trainer"], "elastic": True}})
    with pytest.raises(ConfigError, match="deepspeed.zero_stage: must be 1, 2 or 3"):
        load_config({"deepspeed": {"zero_stage": 4}})


def test_a_bf16_trainer_needs_bf16_engines():
    # Weight sync is bit-exact: bf16 weights cannot be applied to engines serving float32.
    with pytest.raises(ConfigError, match=r'deepspeed.bf16: publishes bfloat16 weights, but the engines serve '
                                          r'model.dtype = "float32"'):
        load_config({"trainer": {"backend": "deepspeed"}})
    assert load_config({"trainer": {"backend": "deepspeed"}, "deepspeed": {"bf16": False}}).deepspeed.bf16 is False
    assert load_config({"trainer": {"backend": "torch"}}).model.dtype == "float32"  # [deepspeed] unused: no rule
