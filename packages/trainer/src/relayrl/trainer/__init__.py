"""relayrl-trainer: replay-aware RL training steps over scored groups."""
