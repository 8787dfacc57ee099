"""Test support for relayrl-buffer and its plugins.

* :func:`make_group` / :func:`make_trajectory`: realistic scored groups (kept-sets, versions, tools);
* :class:`AdmissionPolicyTests`, :class:`PromptSchedulerTests`: conformance suites for plugins;
* ``python -m relayrl.buffer.testing.kill_consumer``: the trainer stand-in of the exactly-once kill test.
"""

from relayrl.buffer.testing.groups import make_group, make_trajectory
from relayrl.buffer.testing.suites import AdmissionPolicyTests, PromptSchedulerTests

__all__ = ["AdmissionPolicyTests", "PromptSchedulerTests", "make_group", "make_trajectory"]
