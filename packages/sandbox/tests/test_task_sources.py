"""Task sources: JSONL files and task folders, chosen by location or by name."""

from __future__ import annotations

import json

import pytest

from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.hookspecs import TASK_SOURCES
from relayrl.sandbox.task_sources import load_tasks
from relayrl.sandbox.testing import TaskSourceTests


def test_jsonl_source_resolves_paths_relative_to_the_file(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "gold.diff").write_text("diff --git a/x b/x\n")
    lines = [{"task_id": "a", "instruction": "do a", "workspace": "repo", "gold_patch": "@gold.diff"},
             {"task_id": "b", "instruction": "do b", "kind": "answer", "answer": 42}]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    first, second = load_tasks(tmp_path / "tasks.jsonl")
    assert first.workspace == str((tmp_path / "repo").resolve()) and first.gold_patch.startswith("diff --git")
    assert second.answer == 42


def test_directory_source_is_chosen_for_directories(tmp_path):
    for name in ("second", "first"):
        (tmp_path / name / "repo").mkdir(parents=True)
        (tmp_path / name / "gold.patch").write_text(f"diff --git a/{name} b/{name}\n")
        (tmp_path / name / "task.json").write_text(json.dumps({"instruction": f"fix {name}", "workspace": "repo",
                                                               "gold_patch": "@gold.patch"}))
    tasks = load_tasks(tmp_path)
    assert [task.task_id for task in tasks] == ["first", "second"]  # the folder names, in order
    assert tasks[0].workspace == str((tmp_path / "first" / "repo").resolve())
    assert tasks[0].gold_patch == "diff --git a/first b/first\n"
    assert sorted(TASK_SOURCES.registrations()) == ["directory", "jsonl"]


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


class TestJsonlSource(TaskSourceTests):
    name = "jsonl"

    def write(self, root, tasks):
        lines = []
        for task in tasks:
            line = {key: task[key] for key in ("task_id", "instruction", "kind", "answer") if key in task}
            for field, folder in (("repo", "workspace"), ("hidden_tests", "hidden_tests")):
                for relative, text in task.get(field, {}).items():
                    path = root / "data" / task["task_id"] / field / relative
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                if field in task:
                    line[folder] = f"data/{task['task_id']}/{field}"
            if "gold_patch" in task:
                (root / "data" / task["task_id"]).mkdir(parents=True, exist_ok=True)
                (root / "data" / task["task_id"] / "gold.diff").write_text(task["gold_patch"])
                line["gold_patch"] = f"@data/{task['task_id']}/gold.diff"
            lines.append(json.dumps(line, ensure_ascii=False))
        (root / "tasks.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return root / "tasks.jsonl"


class TestDirectorySource(TaskSourceTests):
    name = "directory"

    def write(self, root, tasks):
        for task in tasks:
            folder = root / task["task_id"]
            folder.mkdir(parents=True)
            data = {key: task[key] for key in ("instruction", "kind", "answer") if key in task}
            for field, name in (("repo", "workspace"), ("hidden_tests", "hidden_tests")):
                for relative, text in task.get(field, {}).items():
                    (folder / field / relative).parent.mkdir(parents=True, exist_ok=True)
                    (folder / field / relative).write_text(text)
                if field in task:
                    data[name] = field
            if "gold_patch" in task:
                (folder / "gold.patch").write_text(task["gold_patch"])  # found by name, as the shipped tasks are
            (folder / "task.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        return root
