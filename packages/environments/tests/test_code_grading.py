"""The grader: hidden tests only in the grading sandbox, pristine copies, a sandbox per answer, evidence."""

from __future__ import annotations

import msgspec
import pytest

from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.grading import Grader
from relayrl.sandbox.testing import ScriptedAgent, call

FIX_MEDIAN = [[call("read_file", path="stats/median.py")],
              [call("edit", path="stats/median.py", old="    return ordered[len(ordered) // 2]\n",
                    new="    middle = len(ordered) // 2\n    if len(ordered) % 2 == 0:\n"
                        "        return (ordered[middle - 1] + ordered[middle]) / 2\n    return ordered[middle]\n"),
               call("bash", command="python3 -m unittest discover -s tests -t . 2>&1 | tail -1")]]


def test_honest_agent_is_rewarded_and_empty_answer_is_not(backend, tasks):
    task = tasks["median"]
    trajectory, diff = ScriptedAgent(FIX_MEDIAN).run(task, backend)
    assert "OK" in trajectory.segments[0].turns[-1].tool_results[1].output  # visible tests pass in the sandbox
    gold, empty = Grader(backend).grade_group(task, [diff, ""])
    assert (gold.reward, gold.passed, gold.applied, gold.verdict) == (1.0, True, True, "split")
    assert gold.checks > 0 and gold.tests_passed == gold.tests_expected == 3 + gold.checks  # 3 hidden tests
    assert "non-dumpable" in gold.protections.split(",")
    assert (empty.reward, empty.passed) == (0.0, False) and 1 <= empty.tests_passed < empty.tests_expected
    assert "test_even: failed: AssertionError: 3 != 2.5" in empty.output


def test_the_agent_workspace_holds_no_hidden_tests_history_or_reference_artifacts(backend, tasks):
    task = tasks["clamp"]  # its repository ships a SOLUTION.md
    script = [[call("bash", command="ls -a; ls tests; git log --oneline | wc -l; cat SOLUTION.md")]]
    trajectory, _ = ScriptedAgent(script).run(task, backend)
    output = trajectory.segments[0].turns[-1].tool_results[0].output
    assert "test_grading.py" not in output and "SOLUTION.md:" not in output.replace("cat: SOLUTION.md", "")
    assert "No such file" in output and "\n1\n" in output  # one commit of history


def test_an_answer_editing_the_tests_does_not_apply(backend, tasks):
    task = tasks["median"]
    cheat = [[call("write_file", path="tests/test_grading.py", content="import unittest\n")]]
    _, diff = ScriptedAgent(cheat).run(task, backend)
    report = Grader(backend).grade(task, diff)
    assert report.reward == 0.0 and not report.applied and "does not apply" in report.error


def test_an_answer_cannot_rewrite_the_hidden_tests_while_graded(backend, tasks):
    if "unprivileged" not in backend.capabilities():
        pytest.skip(f"needs 'unprivileged' (hidden tests are protected by ownership): {backend.reasons}")
    task = tasks["median"]
    tamper = ("import pathlib\n"
              "try:\n"
              "    pathlib.Path('tests/test_grading.py').write_text('')\n"
              "except OSError:\n"
              "    pass\n")
    cheat = [[call("write_file", path="stats/__init__.py", content=tamper)]]
    _, diff = ScriptedAgent(cheat).run(task, backend)
    report = Grader(backend).grade(task, diff)  # split: the tests are not in the answer's process at all
    assert report.applied and report.reward == 0.0 and report.tests_passed < report.tests_expected
    in_process = msgspec.structs.replace(task, metadata={**task.metadata, "grading": "in-process"})
    report = Grader(backend).grade(in_process, diff)  # in-process: the runner's audit hook sees the write
    assert report.applied and report.reward == 0.0 and report.tests_passed < report.tests_expected
    assert [flag.detector for flag in report.flags] == ["test-edits"] and "test_grading.py" in report.flags[0].evidence


def test_a_bad_grading_choice_is_named_in_one_line(backend, tasks):
    task = tasks["median"]
    task = msgspec.structs.replace(task, metadata={**task.metadata, "grading": "trust-me"})
    with pytest.raises(SandboxError, match=r"median: metadata.grading must be \"split\" or \"in-process\""):
        Grader(backend).grade(task, "")


def test_a_runner_that_could_not_make_itself_non_dumpable_earns_nothing():
    """Fail closed: records from a runner the answer's processes could have ptraced prove nothing."""
    import hashlib
    import hmac

    from relayrl.sandbox.evidence import verify_records

    key = b"k" * 32

    def line(seq, *fields):
        body = repr(tuple(fields))
        return f"RELAYRL-EVIDENCE {seq} {hmac.new(key, f'{seq}|{body}'.encode(), hashlib.sha256).hexdigest()} {body}\n"

    for protections, paid in (("split", False), ("non-dumpable,split", True)):
        stdout = line(0, "start", "1", protections, "3.11", "1") + line(1, "result", "m.test_a", "passed", "") \
            + line(2, "end", "1")
        evidence = verify_records(stdout, key=key, inventory=["m.test_a"])
        assert evidence.passed is paid, evidence.problems


def test_answers_in_one_group_do_not_see_each_other(backend, tasks):
    task = tasks["median"]
    leave_behind = [[call("write_file", path="stats/leftover.txt", content="from answer 0\n")]]
    _, first = ScriptedAgent(leave_behind).run(task, backend)
    probe = [[call("write_file", path="stats/probe.py",
                   content="import os\nassert not os.path.exists('stats/leftover.txt')\n")]]
    _, second = ScriptedAgent(probe).run(task, backend)
    task_probe = task.__class__(**{**{f: getattr(task, f) for f in task.__struct_fields__},
                                   "grading_command": "python3 stats/probe.py", "hidden_tests": ""})
    reports = Grader(backend).grade_group(task_probe, [first, second])
    assert reports[1].passed, reports[1].output


def test_an_answer_that_does_not_apply_is_reported(backend, tasks):
    report = Grader(backend).grade(tasks["median"], "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert report.reward == 0.0 and not report.applied
