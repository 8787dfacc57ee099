"""The ``code`` environment's demonstrations: gold patches as tool calls, played in real sandboxes."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from relayrl.core.wire import TaskSpec
from relayrl.environments.bugfix import Edit, UnsupportedPatch, fix_reply, patch_edits, shipped_tasks
from relayrl.environments.code import ALPHABET, SPECIALS, CodeEnvironment, CodeEnvironmentConfig
from relayrl.rollout.agent import AgentConfig, CodingAgent, iter_segments
from relayrl.rollout.chat import CharTokenizer, RawChatFormat
from relayrl.rollout.demonstrations import ScriptedEngine
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

TOKENIZER = CharTokenizer(ALPHABET, specials=("<pad>", "<bos>", "<|end|>", *SPECIALS))
CHAT = RawChatFormat(TOKENIZER)
AGENT = AgentConfig(system_prompt="", max_turns=6, max_tokens_per_turn=512, max_total_tokens=1024, context_limit=2048,
                    summary_max_tokens=16, compaction_prompt="compact:", summary_header="summary:",
                    show_tool_time=False)

SOURCE = "def f(x):\n    y = x\n    return y\n\n\ndef g(x):\n    y = x\n    return y + 1\n"
TWO_HUNKS = """\
--- a/m.py
+++ b/m.py
@@ -1,3 +1,3 @@
 def f(x):
     y = x
-    return y
+    return y * 2
@@ -6,3 +6,3 @@
 def g(x):
-    y = x
+    y = -x
     return y + 1
"""


def test_hunks_become_edits_of_the_changed_lines_with_just_enough_context_to_be_unique():
    edits = patch_edits(TWO_HUNKS, lambda path: SOURCE)
    # "    y = x\n" occurs twice: the second edit keeps a line of context to say which one it means.
    assert edits == [Edit("m.py", "    return y\n", "    return y * 2\n"),
                     Edit("m.py", "    y = x\n    return y + 1\n", "    y = -x\n    return y + 1\n")]
    text = SOURCE
    for edit in edits:
        assert text.count(edit.old) == 1  # what the edit tool requires
        text = text.replace(edit.old, edit.new)
    assert text == SOURCE.replace("return y\n", "return y * 2\n").replace("    y = x\n    return y + 1", "    y = -x\n    return y + 1")


def test_a_new_file_is_written_and_unsupported_patches_say_why():
    created = "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n\\ No newline at end of file\n"
    assert patch_edits(created, lambda path: "") == [Edit("new.py", "", "a = 1\nb = 2")]
    assert '"name": "write_file"' in patch_edits(created, lambda path: "")[0].call()
    deleted = "--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a = 1\n"
    with pytest.raises(UnsupportedPatch, match="deletes"):
        patch_edits(deleted, lambda path: "a = 1\n")
    with pytest.raises(UnsupportedPatch, match="exactly once"):  # the patch is not for this file
        patch_edits(TWO_HUNKS, lambda path: "something else\n")
    with pytest.raises(UnsupportedPatch, match="changes nothing"):
        patch_edits("", lambda path: "")


def test_a_removed_line_that_looks_like_a_file_header_stays_in_its_hunk():
    source = "x = 1\n-- not a header\ny = 2\n"
    patch = "--- a/s.txt\n+++ b/s.txt\n@@ -1,3 +1,2 @@\n x = 1\n--- not a header\n y = 2\n"
    assert patch_edits(patch, lambda path: source) == [Edit("s.txt", "-- not a header\n", "")]


def test_the_expert_reads_then_edits_files_in_parallel_but_one_file_per_turn_then_answers():
    edits = [Edit("a.py", "1", "2"), Edit("a.py", "3", "4"), Edit("b.py", "5", "6")]
    reply = lambda context: fix_reply(edits, context, compaction_prompt="compact:", summary_header="summary:")  # noqa: E731
    first = reply("task")
    assert first.count('"name": "read_file"') == 2
    second = reply("task" + first)
    assert second.count('"name": "edit"') == 1 and '"a.py"' in second  # the second a.py edit must wait
    third = reply("task" + first + second)
    assert third.count('"name": "edit"') == 2 and '"old": "3"' in third and '"b.py"' in third
    assert reply("task" + first + second + third) == "fixed a.py b.py"
    # Asked to compact, it counts its edits; from the summary it goes on where it was.
    assert reply("task" + first + second + "compact:") == "edits 1"
    assert reply("task\n\nsummary:\nedits 1") == third
    # A harness that never compacts has no prompt: the expert must not take every turn for a request.
    assert fix_reply(edits, "task", compaction_prompt="", summary_header="") == first


def _play(environment: CodeEnvironment, tasks: list[TaskSpec]) -> tuple[list, list[str]]:
    """The expert's trajectories and the answers the environment's tools give for them (the diffs)."""
    edits, skipped = environment._expert_edits(tasks)
    assert not skipped, skipped
    engine = ScriptedEngine(TOKENIZER, lambda group, context: fix_reply(
        edits[group], context, compaction_prompt=AGENT.compaction_prompt, summary_header=AGENT.summary_header))
    proxy = TokenRecordingProxy(engine)

    async def one(task: TaskSpec):
        async with environment.tools(task) as tools:
            trajectory = await CodingAgent(AGENT).run(task, proxy=proxy, tools=tools, chat=CHAT,
                                                      sampling=SamplingParams(), group_id=task.task_id, sample_index=0)
            return trajectory, await asyncio.to_thread(tools.final_answer)

    async def every() -> list:
        return list(await asyncio.gather(*(one(task) for task in tasks)))

    played = asyncio.run(every())
    return [trajectory for trajectory, _ in played], [answer for _, answer in played]


@pytest.mark.skipif(shutil.which("python3") is None, reason="the shipped tasks' hidden tests run with python3")
def test_the_experts_fixes_of_every_shipped_task_pass_its_hidden_tests_in_the_isolated_grader():
    environment = CodeEnvironment()
    tasks = environment.tasks()
    trajectories, answers = _play(environment, tasks)
    for task, trajectory, answer in zip(tasks, trajectories, answers):
        turns = [turn for turn in trajectory.segments[0].turns if turn.role == "assistant"]
        assert [len(turn.tool_calls) for turn in turns] == [1, 1, 0], task.task_id  # read, edit, answer
        results = [result for turn in trajectory.segments[0].turns for result in turn.tool_results]
        assert all(result.exit_status == 0 and not result.error for result in results), results
        assert answer.startswith("diff") or "+++" in answer, answer
        for tokens, trained in iter_segments(trajectory):
            assert all(0 <= token < len(TOKENIZER) for token in tokens) and any(trained)
            assert TOKENIZER.unknown_id not in tokens  # the alphabet covers the code and the calls
        [graded] = asyncio.run(environment.grade(task, [trajectory], [answer]))
        assert graded.reward == 1.0, (task.task_id, graded.metrics)


def test_the_expert_skips_tasks_it_cannot_demonstrate_and_says_which(tmp_path):
    environment = CodeEnvironment()
    good = environment.tasks()[0]
    without = TaskSpec(task_id="no-patch", instruction="x", workspace=good.workspace)
    deleting = TaskSpec(task_id="deletes", instruction="x", workspace=good.workspace,
                        gold_patch="--- a/README.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    escaping = TaskSpec(task_id="escapes", instruction="x", workspace=good.workspace,
                        gold_patch="--- a/../../../etc/hostname\n+++ b/../../../etc/hostname\n@@ -1 +1 @@\n-a\n+b\n")
    edits, skipped = environment._expert_edits([good, without, deleting, escaping])
    assert list(edits) == [good.task_id]
    assert skipped == ["no-patch (no gold patch)", "deletes (README.md: the patch deletes it)",
                       "escapes (../../../etc/hostname: outside the workspace)"]


def test_demonstration_tasks_default_to_the_training_tasks_or_come_from_their_own_source(tmp_path):
    from relayrl.environments.bugfix import SHIPPED_TASKS

    assert [task.task_id for task in CodeEnvironment().demonstration_tasks()] == \
        [task.task_id for task in CodeEnvironment().tasks()]
    subset = tmp_path / "tasks"
    subset.mkdir()
    shutil.copytree(SHIPPED_TASKS / "median", subset / "median")
    environment = CodeEnvironment(CodeEnvironmentConfig(demonstration_tasks=str(subset)))
    assert [task.task_id for task in environment.demonstration_tasks()] == ["median"]
    assert len(environment.tasks()) == 12


def test_the_patch_tool_agrees_with_the_experts_edits_on_every_shipped_task(tmp_path):
    """The edits say what the gold patch says: applied to the workspace they give what `patch` gives."""
    if shutil.which("patch") is None:
        pytest.skip("no patch command here (Debian: apt-get install patch)")
    environment = CodeEnvironment()
    for task in environment.tasks():
        edits, _ = environment._expert_edits([task])
        by_edits, by_patch = tmp_path / task.task_id / "edits", tmp_path / task.task_id / "patch"
        shutil.copytree(task.workspace, by_edits)
        shutil.copytree(task.workspace, by_patch)
        for edit in edits[task.task_id]:
            target = by_edits / edit.path
            target.write_text(target.read_text().replace(edit.old, edit.new, 1) if edit.old else edit.new)
        subprocess.run(["patch", "-s", "-p1", "-d", str(by_patch)], input=task.gold_patch, text=True, check=True)
        for path in by_patch.rglob("*"):
            if path.is_file() and not path.name.endswith(".orig"):
                assert (by_edits / path.relative_to(by_patch)).read_text() == path.read_text(), path


def test_the_shipped_tasks_are_complete():
    from relayrl.sandbox.workspace import hidden_test_paths

    tasks = shipped_tasks()
    assert len(tasks) >= 12 and len({task.task_id for task in tasks}) == len(tasks)
    for task in tasks:
        assert task.kind == "code" and task.instruction and task.grading_command
        assert task.gold_patch and task.gold_patch.startswith("diff --git")
        assert Path(task.workspace).is_dir() and hidden_test_paths(task) == ["tests/test_grading.py"]
        assert not (Path(task.workspace) / "tests" / "test_grading.py").exists()
