"""``TaskSourceTests``: the conformance suite of task sources, built in or plugin.

A task source turns a location into :class:`~relayrl.core.wire.TaskSpec` records. Training, evaluation,
``relayrl data verify`` and the graders all trust what it yields, so the suite checks what each of
them relies on: every field survives (unicode included), paths come back absolute and pointing at the
files written, a gold patch given by file is read, the order is stable and reading twice gives the
same tasks, a missing location is a :class:`~relayrl.sandbox.api.SandboxError` naming it, and a source
with the ``detects`` capability accepts its own locations and not a missing one.

Subclass it, set ``name`` (the registered name) and implement :meth:`TaskSourceTests.write`: lay
``tasks`` out under ``root`` in your source's format and return the location to read::

    class TestMySource(TaskSourceTests):
        name = "my-source"

        def write(self, root, tasks):
            ...
            return root / "tasks.my"
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from relayrl.core.wire import TaskSpec
from relayrl.sandbox.api import SandboxError

__all__ = ["TASKS", "TaskSourceTests"]

TASKS: list[dict[str, Any]] = [
    {"task_id": "clamp", "instruction": "clamp() ignores its upper bound; fix it.", "kind": "code",
     "repo": {"mathutil/clamp.py": "def clamp(x, lo, hi):\n    return max(lo, x)\n", "README.md": "mathutil\n"},
     "hidden_tests": {"tests/test_grading.py": "import unittest\n"},
     "gold_patch": "diff --git a/mathutil/clamp.py b/mathutil/clamp.py\n--- a/mathutil/clamp.py\n"
                   "+++ b/mathutil/clamp.py\n@@ -1,2 +1,2 @@\n def clamp(x, lo, hi):\n"
                   "-    return max(lo, x)\n+    return min(hi, max(lo, x))\n"},
    {"task_id": "übersetzung-ñ", "instruction": "Übersetze « bonjour » — 日本語も。", "kind": "answer",
     "answer": {"text": "hallo", "alternatives": ["guten Tag"]}},
    {"task_id": "a-first-by-name", "instruction": "list the files", "kind": "code",
     "repo": {"a.py": "x = 1\n"}},
]
"""The tasks the suite writes: a bug fix with a workspace, hidden tests and a gold patch; an answer
task with unicode and a structured answer; a second code task whose id sorts first."""


class TaskSourceTests:
    """Conformance suite for task sources (``factory(location) -> Iterable[TaskSpec]``)."""

    name: str = ""

    def write(self, root: Path, tasks: list[dict[str, Any]]) -> Path:
        """Lay ``tasks`` out under ``root`` in this source's format; return the location to read.

        Each task: ``task_id``, ``instruction``, ``kind``, and optionally ``answer``, ``repo`` (relative
        path -> text: the workspace's files), ``hidden_tests`` (relative path -> text) and ``gold_patch``
        (text, to be stored in a file the task refers to).
        """
        raise NotImplementedError("implement write(root, tasks)")

    @pytest.fixture
    def record(self):
        from relayrl.sandbox.hookspecs import TASK_SOURCES

        table = TASK_SOURCES.registrations()
        assert self.name in table, f"{self.name!r} is not a registered task source ({sorted(table)})"
        return table[self.name]

    @pytest.fixture
    def location(self, tmp_path) -> Path:
        return self.write(tmp_path / "tasks", [dict(task) for task in TASKS])

    def _read(self, record, location) -> list[TaskSpec]:
        tasks = list(record.factory(location))
        assert all(isinstance(task, TaskSpec) for task in tasks)
        return tasks

    def test_every_field_survives(self, record, location) -> None:
        by_id = {task.task_id: task for task in self._read(record, location)}
        assert sorted(by_id) == sorted(task["task_id"] for task in TASKS)
        for written in TASKS:
            task = by_id[written["task_id"]]
            assert (task.instruction, task.kind) == (written["instruction"], written["kind"])
            assert task.answer == written.get("answer")
            assert task.gold_patch == written.get("gold_patch")

    def test_paths_are_absolute_and_hold_the_files_written(self, record, location) -> None:
        by_id = {task.task_id: task for task in self._read(record, location)}
        for written in TASKS:
            task = by_id[written["task_id"]]
            for field, files in (("workspace", written.get("repo")), ("hidden_tests", written.get("hidden_tests"))):
                value = getattr(task, field)
                if not files:
                    continue
                assert Path(value).is_absolute() and Path(value).is_dir(), f"{task.task_id}.{field} = {value!r}"
                for relative, text in files.items():
                    assert (Path(value) / relative).read_text() == text, f"{task.task_id}: {field}/{relative}"

    def test_the_order_is_stable_and_reading_twice_gives_the_same_tasks(self, record, location) -> None:
        first, second = self._read(record, location), self._read(record, location)
        assert first == second

    def test_load_tasks_by_name_reads_the_same_tasks(self, record, location) -> None:
        from relayrl.sandbox.task_sources import load_tasks

        assert load_tasks(location, source=self.name) == self._read(record, location)

    def test_a_missing_location_is_an_error_naming_it(self, record, tmp_path) -> None:
        missing = tmp_path / "no-such-tasks"
        with pytest.raises(SandboxError, match=re.escape(str(missing))):
            self._read(record, missing)

    def test_a_detecting_source_accepts_its_own_locations_and_not_a_missing_one(self, record, location,
                                                                              tmp_path) -> None:
        if "detects" not in record.capabilities:
            pytest.skip(f"{self.name} does not declare `detects`: it is chosen by name only")
        assert record.factory.accepts(location)
        assert not record.factory.accepts(tmp_path / "no-such-tasks")
