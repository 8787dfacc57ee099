"""relayrl-fault-tolerance: async per-step checkpoints, peer replicas, recovery, fault injection."""
