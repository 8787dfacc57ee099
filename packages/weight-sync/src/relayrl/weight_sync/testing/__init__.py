"""Test helpers for relayrl-weight-sync: synthetic models and the SIGKILL publisher.

* :mod:`relayrl.weight_sync.testing.synthetic`: bf16-like models and Adam-like updates (numpy only).
* :mod:`relayrl.weight_sync.testing.kill_publisher`: a publisher process for the fault test.
"""
