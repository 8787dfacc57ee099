"""Task sources, the shipped task set, and the code-search environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.codesearch import f1_score, grade_code_search, parse_file_answer
from relayrl.sandbox.config import task_sources
from relayrl.sandbox.tasks import load_tasks, shipped_code_search_tasks, shipped_tasks
from relayrl.sandbox.workspace import hidden_test_paths


def test_shipped_bugfix_tasks_are_complete():
    tasks = shipped_tasks()
    assert len(tasks) >= 12 and len({task.task_id for task in tasks}) == len(tasks)
    for task in tasks:
        assert task.kind == "code" and task.instruction and task.grading_command
        assert task.gold_patch and task.gold_patch.startswith("diff --git")
        assert Path(task.workspace).is_dir() and hidden_test_paths(task) == ["tests/test_grading.py"]
        assert not (Path(task.workspace) / "tests" / "test_grading.py").exists()


def test_shipped_code_search_questions_name_existing_files():
    questions = shipped_code_search_tasks()
    assert len(questions) >= 5
    for task in questions:
        assert task.kind == "code-search" and task.answer
        assert all((Path(task.workspace) / path).is_file() for path in task.answer)


def test_jsonl_source_resolves_paths_relative_to_the_file(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "gold.diff").write_text("diff --git a/x b/x\n")
    lines = [{"task_id": "a", "instruction": "do a", "workspace": "repo", "gold_patch": "@gold.diff"},
             {"task_id": "b", "instruction": "do b", "kind": "answer", "answer": 42}]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    first, second = load_tasks(tmp_path / "tasks.jsonl")
    assert first.workspace == str((tmp_path / "repo").resolve()) and first.gold_patch.startswith("diff --git")
    assert second.answer == 42


def test_directory_source_is_chosen_for_directories():
    tasks = load_tasks(Path(shipped_tasks()[0].workspace).parent.parent)
    assert [task.task_id for task in tasks] == [task.task_id for task in shipped_tasks()]
    assert sorted(task_sources()) == ["directory", "jsonl"]


@pytest.mark.parametrize("content, message", [
    ('{"task_id": "a"', r"tasks.jsonl:1: invalid JSON"),
    ('{"task_id": "a", "instruction": 3}', r"tasks.jsonl:1: invalid task: Expected `str`, got `int` - at `\$.instruction`"),
    ('{"task_id": "a", "instruction": ""}\n{"task_id": "a", "instruction": ""}', "task id 'a' appears twice"),
])
def test_bad_task_files_are_named(tmp_path, content, message):
    (tmp_path / "tasks.jsonl").write_text(content)
    with pytest.raises(SandboxError, match=message):
        load_tasks(tmp_path / "tasks.jsonl")


def test_unknown_locations_and_sources_are_refused(tmp_path):
    with pytest.raises(SandboxError, match="no task source accepts it"):
        load_tasks(tmp_path / "absent.csv")
    with pytest.raises(Exception, match="unknown task source 'csv'"):
        load_tasks(tmp_path, source="csv")


@pytest.mark.parametrize("predicted, truth, expected", [
    ({"a.py", "b.py"}, {"a.py", "b.py"}, 1.0), ({"a.py"}, {"a.py", "b.py"}, 2 / 3), (set(), {"a.py"}, 0.0),
    ({"c.py"}, {"a.py"}, 0.0), (set(), set(), 1.0), ({"a.py", "b.py", "c.py", "d.py"}, {"a.py"}, 0.4),
])
def test_f1(predicted, truth, expected):
    assert f1_score(predicted, truth) == pytest.approx(expected)


def test_code_search_grading_parses_free_text_answers():
    task = next(task for task in shipped_code_search_tasks() if task.task_id == "cs-env-vars")
    reward, report = grade_code_search(task, "The files are `shop/config.py` and ./shop/api.py.")
    assert reward == 1.0 and report["missing"] == [] and report["extra"] == []
    everything = "\n".join(str(path.relative_to(task.workspace)) for path in Path(task.workspace).rglob("*.py"))
    assert grade_code_search(task, everything)[0] < 0.5  # naming every file is not rewarded
    assert parse_file_answer("shop/utils/dates.py, shop/cli.py") == {"shop/utils/dates.py", "shop/cli.py"}


def test_code_search_agent_explores_with_read_only_tools(backend):
    from relayrl.sandbox.testing import ScriptedAgent, call

    task = next(task for task in shipped_code_search_tasks() if task.task_id == "cs-env-vars")
    trajectory, diff = ScriptedAgent([[call("grep", pattern="os.environ")]]).run(task, backend)
    output = trajectory.segments[0].turns[-1].tool_results[0].output
    assert grade_code_search(task, output)[0] == 1.0 and diff == ""
