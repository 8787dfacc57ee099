"""Conformance suites and test helpers of relayrl-sandbox.

* :class:`SandboxTests`: the suite every sandbox backend passes (protocol + hostile programs);
* :class:`ScriptedAgent`: replays a fixed list of tool-call turns against a task, for grader and
  exploit-detector tests (cheating and honest agents alike).

The cheating answers every code grader must pay 0 (``GraderTests``) are relayrl-environments':
:mod:`relayrl.environments.testing`.
"""

from relayrl.sandbox.testing.agents import ScriptedAgent, call
from relayrl.sandbox.testing.sandbox_tests import SandboxTests, TrackedSandbox, stray_processes

__all__ = ["SandboxTests", "ScriptedAgent", "TrackedSandbox", "call", "stray_processes"]
