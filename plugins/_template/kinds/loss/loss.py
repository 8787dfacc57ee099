"""A policy loss: the importance-weighted policy gradient ``-w * A * logprob`` (no clipping).

Losses get replayed logprobs (renormalised over each token's recorded kept-set, so a token sampled
from a kept-set of one has logprob 0 and no gradient), old-policy logprobs, advantages, a mask and
the mismatch correction's weights; they aggregate per-token terms as their ``aggregation`` says
(the trainer normalises over the whole batch with it).
"""

from __future__ import annotations

from relayrl.algo.losses import Aggregation, ConfiguredLoss, LossInputs, LossOutput, aggregate
from relayrl.core.config import Section


class PolicyGradient(ConfiguredLoss):
    """``-w * A * logprob`` over replayed logprobs, aggregated as configured."""

    class Config(Section, kw_only=True):
        aggregation: Aggregation = "token-mean"
        normalizer: float | None = None
        """The constant for aggregation = "constant"."""

    def __init__(self, config: PolicyGradient.Config | None = None) -> None:
        self.config = config or self.Config()

    def __call__(self, inputs: LossInputs) -> LossOutput:
        per_token = -inputs.weights * inputs.token_advantages * inputs.logprobs
        loss = aggregate(per_token, inputs.mask, self.config.aggregation, normalizer=self.config.normalizer,
                         denominator=inputs.denominator)
        return LossOutput(loss, {})
