"""``relayrl eval``: how good a model is, on which tasks, at what cost (see :mod:`relayrl.rollout.evaluation`)."""
