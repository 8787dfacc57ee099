"""Conformance suites and test helpers of relayrl-sandbox.

* :class:`SandboxTests`: the suite every sandbox backend passes (protocol + hostile programs);
* :class:`ExploitDetectorTests`: the suite every exploit detector passes (flags what it exists for,
  silent on honest work, a pure function, no crash on odd input);
* :class:`TaskSourceTests`: the suite every task source passes (fields, paths, order, errors);
* :class:`ScriptedAgent`: replays a fixed list of tool-call turns against a task, for grader and
  exploit-detector tests (cheating and honest agents alike).

The cheating answers every code grader must pay 0 (``GraderTests``) are relayrl-environments':
:mod:`relayrl.environments.testing`.
"""

from relayrl.sandbox.testing.agents import ScriptedAgent, call
from relayrl.sandbox.testing.detector_tests import ExploitDetectorTests, context, honest_contexts
from relayrl.sandbox.testing.sandbox_tests import SandboxTests, TrackedSandbox, stray_processes
from relayrl.sandbox.testing.task_source_tests import TASKS, TaskSourceTests

__all__ = ["TASKS", "ExploitDetectorTests", "SandboxTests", "ScriptedAgent", "TaskSourceTests", "TrackedSandbox",
           "call", "context", "honest_contexts", "stray_processes"]
