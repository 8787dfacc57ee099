"""Every built-in environment passes the conformance suite a plugin's environment passes."""

from __future__ import annotations

import pytest

from relayrl.environments.code_search import CodeSearchConfig, CodeSearchEnvironment
from relayrl.environments.countdown import CountdownConfig, CountdownEnvironment
from relayrl.rollout.testing import EnvironmentTests


class TestCountdown(EnvironmentTests):
    @pytest.fixture
    def environment(self):
        environment = CountdownEnvironment(CountdownConfig(tasks=200, eval_tasks=20))
        yield environment
        environment.close()


class TestCodeSearch(EnvironmentTests):
    @pytest.fixture
    def environment(self):
        environment = CodeSearchEnvironment(CodeSearchConfig(tasks=20, eval_tasks=5))
        yield environment
        environment.close()

    def reference_answer(self, environment, task):
        return " ".join(task.answer), ""  # the files to find, named in the final message


class TestCodeBugFix(EnvironmentTests):
    @pytest.fixture
    def environment(self):
        from relayrl.environments.code import CodeEnvironment

        environment = CodeEnvironment()
        yield environment
        environment.close()

    def reference_answer(self, environment, task):
        return "done", task.gold_patch  # the answer is the workspace's diff: the task's own fix
