"""Test support for relayrl-buffer and its plugins.

* :func:`make_group` / :func:`make_trajectory`: realistic scored groups (kept-sets, versions, tools);
* :class:`AdmissionPolicyTests`, :class:`PromptSchedulerTests`: conformance suites for plugins
  (they need pytest, so they are imported on first use);
* ``python -m relayrl.buffer.testing.kill_consumer`` / ``kill_producer``: the trainer and rollout
  stand-ins of the kill tests.
"""

from typing import Any

from relayrl.buffer.testing.groups import make_group, make_trajectory

__all__ = ["AdmissionPolicyTests", "PromptSchedulerTests", "make_group", "make_trajectory"]


def __getattr__(name: str) -> Any:
    # Benchmarks and the kill-test processes use the group builders without pytest installed.
    if name in ("AdmissionPolicyTests", "PromptSchedulerTests"):
        from relayrl.buffer.testing import suites

        return getattr(suites, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
