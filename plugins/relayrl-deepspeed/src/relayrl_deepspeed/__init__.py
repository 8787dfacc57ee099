"""relayrl-deepspeed: DeepSpeed ZeRO trainer backend for relayrl."""
