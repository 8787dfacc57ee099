"""relayrl-environments' plugin: the built-in environments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.environment import EnvironmentFactory


@hookimpl
def relayrl_rollout_environments() -> Iterator[Registration[EnvironmentFactory]]:
    from relayrl.environments.code import CodeEnvironment
    from relayrl.environments.code_search import CodeSearchEnvironment
    from relayrl.environments.countdown import CountdownEnvironment
    from relayrl.environments.kernels.environment import KernelEnvironment

    yield Registration("countdown", CountdownEnvironment, "countdown-lite arithmetic, answers graded in the sandbox", config=CountdownEnvironment.Config)
    yield Registration("code", CodeEnvironment, "the shipped bug-fix tasks: agent tools and hidden tests in sandboxes", config=CodeEnvironment.Config)
    yield Registration("code-search", CodeSearchEnvironment,
                       "generated repositories: find files with search tools in sandboxes, F1 graded in a sandbox", config=CodeSearchEnvironment.Config)
    yield Registration("kernels", KernelEnvironment,
                       "faster NumPy kernels: correctness on fresh inputs and interleaved timing in sandboxes, "
                       "timing exploits flagged", config=KernelEnvironment.Config)
