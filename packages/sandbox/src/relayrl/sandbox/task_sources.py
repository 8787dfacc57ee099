"""Task sources: where :class:`relayrl.core.wire.TaskSpec` records come from.

Built in (hook ``relayrl_sandbox_task_sources``):

``jsonl``
    One TaskSpec JSON object per line. ``workspace``, ``hidden_tests`` and a ``gold_patch`` given
    as ``@file`` are resolved relative to the file.
``directory``
    One sub-folder per task holding ``task.json`` (the TaskSpec fields; ``task_id`` defaults to the
    folder name), usually with ``repo/`` (the workspace), ``hidden_tests/`` (overlaid on the
    workspace root when grading) and ``gold.patch``.

Shipped task data lives with its environment (relayrl-environments), not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.errors import PluginError
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec
from relayrl.sandbox.api import SandboxError

__all__ = ["DirectorySource", "JsonlSource", "load_tasks"]


def _resolve(data: dict[str, Any], base: Path, where: str) -> TaskSpec:
    data = dict(data)
    for field in ("workspace", "hidden_tests"):
        value = data.get(field)
        if value and not Path(value).is_absolute() and "://" not in value:
            data[field] = str((base / value).resolve())
    gold = data.get("gold_patch")
    if isinstance(gold, str) and gold.startswith("@"):
        data["gold_patch"] = (base / gold[1:]).read_text()
    try:
        return msgspec.convert(data, TaskSpec)
    except msgspec.ValidationError as exc:
        raise SandboxError(f"{where}: invalid task: {exc}") from None


class JsonlSource:
    """Tasks from a JSONL file (one TaskSpec object per line)."""

    def __init__(self, location: str | Path) -> None:
        self.path = Path(location)

    @staticmethod
    def accepts(location: str | Path) -> bool:
        return str(location).endswith((".jsonl", ".ndjson")) and Path(location).is_file()

    def __iter__(self) -> Iterator[TaskSpec]:
        if not self.path.is_file():
            raise SandboxError(f"{self.path}: no such task file")
        with open(self.path) as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SandboxError(f"{self.path}:{number}: invalid JSON: {exc}") from None
                yield _resolve(data, self.path.parent, f"{self.path}:{number}")


class DirectorySource:
    """Tasks from a directory with one sub-folder (holding ``task.json``) per task, in name order."""

    def __init__(self, location: str | Path) -> None:
        self.path = Path(location)

    @staticmethod
    def accepts(location: str | Path) -> bool:
        return Path(location).is_dir()

    def __iter__(self) -> Iterator[TaskSpec]:
        if not self.path.is_dir():
            raise SandboxError(f"{self.path}: no such task directory")
        for folder in sorted(path for path in self.path.iterdir() if (path / "task.json").is_file()):
            try:
                data = json.loads((folder / "task.json").read_text())
            except json.JSONDecodeError as exc:
                raise SandboxError(f"{folder / 'task.json'}: invalid JSON: {exc}") from None
            data.setdefault("task_id", folder.name)
            if "gold_patch" not in data and (folder / "gold.patch").is_file():
                data["gold_patch"] = "@gold.patch"
            yield _resolve(data, folder, str(folder / "task.json"))


def load_tasks(location: str | Path, *, source: str | None = None, pm: PluginManager | None = None) -> list[TaskSpec]:
    """All tasks at ``location``, through the named source or the first registered one that accepts it."""
    from relayrl.sandbox.hookspecs import TASK_SOURCES

    table = TASK_SOURCES.registrations(pm)
    if source is not None:
        if source not in table:
            raise PluginError(f"unknown task source {source!r} (available: {', '.join(sorted(table))})")
        factory = table[source].factory
    else:
        candidates = [record.factory for record in table.values()
                      if "detects" in record.capabilities and record.factory.accepts(location)]
        if not candidates:
            raise SandboxError(f"{location}: no task source accepts it (available: {', '.join(sorted(table))})")
        factory = candidates[0]
    tasks = list(factory(location))
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise SandboxError(f"{location}: task id {task.task_id!r} appears twice")
        seen.add(task.task_id)
    return tasks

