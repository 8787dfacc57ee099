"""relayrl-algo: the mathematics of replay-aware asynchronous RL.

* :mod:`relayrl.algo.sampling`: ``sample_tokens`` (kept-set capture), ``truncate_logits`` (the same rule
  for engines that sample with their own kernels) and ``replay_logprobs``;
* :mod:`relayrl.algo.advantages`: GRPO, Dr.GRPO, RLOO;
* :mod:`relayrl.algo.losses`: PPO-clip, GSPO, CISPO and aggregation modes;
* :mod:`relayrl.algo.correction`: truncated / masked importance sampling and mismatch metrics;
* :mod:`relayrl.algo.optim`: Muon + AdamW; :mod:`relayrl.algo.determinism`;
* :mod:`relayrl.algo.length_penalty`; :mod:`relayrl.algo.monitors`;
* :mod:`relayrl.algo.config`: the ``[algo]`` section and builders; :mod:`relayrl.algo.testing`: ``LossTests``.

Names are imported lazily, so that loading the plugin (``relayrl plugins``) does not import torch.
Formulas and defaults: ``docs/algorithms.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "sample_tokens": "sampling", "truncate_logits": "sampling", "replay_logprobs": "sampling", "full_entropy": "sampling",
    "KeptSets": "sampling", "SampleResult": "sampling",
    "GRPO": "advantages", "DrGRPO": "advantages", "RLOO": "advantages", "AdvantageResult": "advantages",
    "PPOClip": "losses", "GSPO": "losses", "CISPO": "losses", "LossInputs": "losses", "LossOutput": "losses",
    "aggregate": "losses",
    "MismatchInputs": "correction", "CorrectionResult": "correction",
    "build_optimizer": "optim",
    "enable_determinism": "determinism",
    "AlternatingLengthPenalty": "length_penalty",
    "MonitorSet": "monitors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relayrl.algo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"relayrl.algo.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
