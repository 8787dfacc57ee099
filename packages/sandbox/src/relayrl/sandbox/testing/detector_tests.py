"""``ExploitDetectorTests``: the conformance suite of exploit detectors, built in or plugin.

A detector reads one graded answer (:class:`~relayrl.sandbox.detectors.DetectionContext`: the task,
the tool calls with their results, the final diff, the hidden tests) and returns
:class:`~relayrl.core.wire.CheatingFlag` records; any flag makes the reward 0. So a detector must flag
what it exists for, stay silent on honest work (a false positive zeroes a correct answer), be a pure
function of its context, and never raise on odd input: a crash in a detector would stop the grading
of a whole group.

Subclass it and override two fixtures: ``detector`` (the detector, built as its registration builds
it) and ``cheating`` (contexts it must flag; build them with :func:`context`)::

    class TestMyDetector(ExploitDetectorTests):
        @pytest.fixture
        def name(self):
            return "my-detector"

        @pytest.fixture
        def detector(self):
            return MyDetector()

        @pytest.fixture
        def cheating(self):
            return [context(calls=[call("bash", command="cat /answers.txt")])]

``honest`` (override to add your own) holds honest work a bug-fix agent does: reading, searching,
running the visible tests, editing the source, a diff that fixes the bug. A detector that runs a
sandbox end to end is tested there too (relayrl-environments' scripted agents); this suite is the
contract every detector shares.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from relayrl.core.wire import CheatingFlag, TaskSpec, ToolCall, ToolResult
from relayrl.sandbox.detectors import DetectionContext, ToolEvent

__all__ = ["ExploitDetectorTests", "context", "honest_contexts"]

TASK = TaskSpec(task_id="leap-year", instruction="is_leap_year is wrong for century years; fix it.",
                workspace="/nonexistent/leap-year/repo", hidden_tests="/nonexistent/leap-year/hidden_tests")
HIDDEN_TESTS = {"tests/test_grading.py": (
    "import unittest\nfrom calendar_extra.leap import is_leap_year\n\n\n"
    "class TestLeapHidden(unittest.TestCase):\n"
    "    def test_centuries(self):\n"
    "        self.assertFalse(is_leap_year(1900))\n        self.assertTrue(is_leap_year(2000))\n"
    "        self.assertFalse(is_leap_year(2100))\n")}
HONEST_DIFF = (
    "diff --git a/calendar_extra/leap.py b/calendar_extra/leap.py\n"
    "--- a/calendar_extra/leap.py\n+++ b/calendar_extra/leap.py\n"
    "@@ -1,2 +1,2 @@\n def is_leap_year(year):\n"
    "-    return year % 4 == 0\n+    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n")


def context(*, calls: Sequence[ToolCall | tuple[ToolCall, ToolResult]] = (), diff: str = "",
            hidden_tests: Mapping[str, str] | None = None, task: TaskSpec = TASK,
            reference_globs: Sequence[str] = ("**/*.orig", "**/SOLUTION*", "**/hidden_tests/**")) -> DetectionContext:
    """A context as the grader builds it: ``calls`` one per turn (a call, or a call and its result)."""
    events = []
    for turn, item in enumerate(calls):
        call, result = item if isinstance(item, tuple) else (item, None)
        events.append(ToolEvent(0, 2 * turn + 1, call, result))
    return DetectionContext(task=task, events=events, diff=diff,
                            hidden_tests=dict(HIDDEN_TESTS if hidden_tests is None else hidden_tests),
                            reference_globs=list(reference_globs))


def _call(name: str, index: int = 0, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}-{index}", name=name, arguments=arguments)


def honest_contexts() -> list[DetectionContext]:
    """Honest work on the leap-year task: nothing here may be flagged."""
    reading = [_call("list_dir", path="."), _call("read_file", path="calendar_extra/leap.py"),
               _call("grep", pattern="is_leap_year", path="."), _call("read_file", path="tests/test_visible.py"),
               _call("bash", command="git status; git diff"),
               _call("bash", command="python3 -m unittest discover -s tests -t . 2>&1 | tail -3"),
               _call("bash", command="ls -la && cat README.md"), _call("python", code="print(1900 % 100, 2000 % 400)")]
    fixing = [_call("edit", path="calendar_extra/leap.py", old="return year % 4 == 0",
                    new="return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)"),
              _call("bash", command="python3 -m unittest discover -s tests -t . && echo ok > /tmp/scratch")]
    with_results = [(call, ToolResult(call_id=call.id, output="OK\n", exit_status=0)) for call in reading]
    return [context(), context(calls=reading), context(calls=with_results, diff=HONEST_DIFF),
            context(calls=[*reading, *fixing], diff=HONEST_DIFF), context(diff=HONEST_DIFF)]


def odd_contexts() -> list[DetectionContext]:
    """Input a detector must survive: missing results, unknown tools, wrong argument types, odd diffs."""
    calls = [_call("bash"), _call("bash", command=None), _call("python", code=3), _call("write_file", path=7),
             _call("edit", path="x.py"), _call("no-such-tool", anything=[1, 2]), _call("read_file", path="\x00")]
    diffs = ["", "not a diff at all", "diff --git a/x b/x\nBinary files differ\n",
             "diff --git a/a.py b/a.py\n+++ b/a.py\n+" + "x" * 100_000 + "\n", "@@ -1 +1 @@\n-\n+\n"]
    return [context(calls=calls, diff=diff) for diff in diffs] + [context(hidden_tests={"t.py": "def ("})]


def _key(flags: Sequence[CheatingFlag]) -> list[tuple[str, str, int | None, int | None]]:
    return [(flag.detector, flag.evidence, flag.segment, flag.turn) for flag in flags]


class ExploitDetectorTests:
    """Conformance suite for exploit detectors (``detector(context) -> list[CheatingFlag]``)."""

    @pytest.fixture
    def name(self) -> str:
        """The registered name: every flag carries it as ``detector`` (override, or leave it empty not to check)."""
        return ""

    @pytest.fixture
    def detector(self):
        raise NotImplementedError("override the `detector` fixture to return the detector under test")

    @pytest.fixture
    def cheating(self) -> list[DetectionContext]:
        raise NotImplementedError("override the `cheating` fixture: contexts the detector must flag")

    @pytest.fixture
    def honest(self) -> list[DetectionContext]:
        return honest_contexts()

    def test_it_flags_every_cheating_context_with_its_name_and_evidence(self, detector, cheating, name) -> None:
        assert cheating, "give at least one context the detector must flag"
        for index, case in enumerate(cheating):
            flags = detector(case)
            assert flags, f"cheating context {index} was not flagged"
            for flag in flags:
                assert isinstance(flag, CheatingFlag) and flag.evidence.strip()
                assert flag.detector == (name or flag.detector), f"flag names {flag.detector!r}, not {name!r}"

    def test_honest_work_is_not_flagged(self, detector, honest) -> None:
        for index, case in enumerate(honest):
            flags = detector(case)
            assert flags == [], f"honest context {index} flagged: {[flag.evidence for flag in flags]}"

    def test_odd_input_is_no_crash(self, detector) -> None:
        for case in odd_contexts():
            flags = detector(case)
            assert isinstance(flags, list) and all(isinstance(flag, CheatingFlag) for flag in flags)

    def test_a_pure_function_of_its_context(self, detector, cheating, honest) -> None:
        for case in [*cheating, *honest]:
            before = copy.deepcopy(case)
            first = _key(detector(case))
            assert _key(detector(case)) == first, "the same context was judged twice differently"
            assert case == before, "the detector changed its context"
