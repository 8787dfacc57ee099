"""Suites of relayrl-environments, for sandbox backends and graders to pass.

* :class:`GraderTests`: cheating answers to the shipped bug-fix tasks (ending the runner, bending the
  tests, disguised always-equal objects, attacks on the process holding the tests, tables of expected
  outputs in any spelling ...) that a backend and the ``code`` grader must pay 0, and the gold patches
  they must pay 1, through the grader and the exploit detectors together;
* :class:`KernelExploitTests`: timing exploits against the ``kernels`` grader (reaching another
  process, more cores, work outside the timed batch, switching the guard off) that must earn no
  more than an honest answer.

A sandbox backend's plugin subclasses both with its backend (relayrl-bwrap does).
"""

from relayrl.environments.testing.cheats import CHEATS, Cheat, GraderTests, answer_diff
from relayrl.environments.testing.kernel_exploits import EXPLOITS, KernelExploit, KernelExploitTests

__all__ = ["CHEATS", "EXPLOITS", "Cheat", "GraderTests", "KernelExploit", "KernelExploitTests", "answer_diff"]
