"""Conformance suites and test helpers of relayrl-sandbox.

* :class:`SandboxTests`: the suite every sandbox backend passes (protocol + hostile programs);
* :class:`GraderTests`: 100 cheating answers in families (ending the runner, bending the tests,
  disguised always-equal objects, attacks on the process holding the tests, tables of expected
  outputs in any spelling ...) every backend and grader must pay 0 (and the gold patches 1),
  through the grader and the exploit detectors together;
* :class:`ScriptedAgent`: replays a fixed list of tool-call turns against a task, for grader and
  exploit-detector tests (cheating and honest agents alike).
"""

from relayrl.sandbox.testing.agents import ScriptedAgent, call
from relayrl.sandbox.testing.cheats import CHEATS, Cheat, GraderTests, answer_diff
from relayrl.sandbox.testing.sandbox_tests import SandboxTests, TrackedSandbox, stray_processes

__all__ = ["CHEATS", "Cheat", "GraderTests", "SandboxTests", "ScriptedAgent", "TrackedSandbox", "answer_diff", "call", "stray_processes"]
