"""Test helpers for relayrl-weight-sync: the codec conformance suite, synthetic models and the
SIGKILL publisher.

* :class:`CodecTests` (:mod:`relayrl.weight_sync.testing.codec_tests`): what every codec passes.
* :mod:`relayrl.weight_sync.testing.synthetic`: bf16-like models and Adam-like updates (numpy only).
* :mod:`relayrl.weight_sync.testing.kill_publisher`: a publisher process for the fault test.
"""

from relayrl.weight_sync.testing.codec_tests import CodecTests

__all__ = ["CodecTests"]
