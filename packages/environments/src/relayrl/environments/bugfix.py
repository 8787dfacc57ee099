"""The bug-fix domain: the shipped tasks, and an expert that applies a task's gold patch with the tools.

:func:`shipped_tasks` reads the tasks shipped in this package (:data:`SHIPPED_TASKS`: tiny Python
repositories with a bug, hidden tests and a gold patch; one folder per task, the ``directory`` task
source's layout), the ``code`` environment's default task set.

The expert:
A supervised warm-up needs trajectories in the agent's format. For a bug-fix task with a gold
patch, the expert reads the files the patch touches (in parallel, one ``read_file`` call each),
applies each hunk with the ``edit`` tool (a new file with ``write_file``), and answers. Its edits
are the patch's hunks cut down to the lines that change plus what context keeps them unique in the
file, as a person would write them. Played through the real harness and sandboxes
(:func:`relayrl.rollout.demonstrations.play_scripted`), every tool result is the real one.

What the warm-up learns from it is the format of reading and editing; learning to *find* a fix is
RL's business, and a warm-up on the very tasks RL trains on hands the policy their answers (fine
for a smoke test of the path; the ``code`` environment's ``demonstration_tasks`` points elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from relayrl.core.wire import TaskSpec
from relayrl.rollout.demonstrations import asked_to_compact

__all__ = ["SHIPPED_TASKS", "Edit", "UnsupportedPatch", "fix_reply", "patch_edits", "shipped_tasks"]

SHIPPED_TASKS = Path(__file__).resolve().parent / "tasks" / "bugfix"
"""The shipped bug-fix tasks' folder (one sub-folder per task)."""


def shipped_tasks() -> list[TaskSpec]:
    """The shipped bug-fix tasks (stdlib ``unittest`` hidden tests), in folder order."""
    from relayrl.sandbox.task_sources import DirectorySource

    return list(DirectorySource(SHIPPED_TASKS))


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class UnsupportedPatch(ValueError):
    """A patch the expert cannot apply with ``edit`` and ``write_file`` (a deletion, a rename, a binary file)."""


@dataclasses.dataclass(frozen=True)
class Edit:
    """One tool call of the expert: replace ``old`` by ``new`` in ``path``; ``old == ""`` creates the file."""

    path: str
    old: str
    new: str

    def call(self) -> str:
        if self.old:
            payload = {"name": "edit", "arguments": {"path": self.path, "old": self.old, "new": self.new}}
        else:
            payload = {"name": "write_file", "arguments": {"path": self.path, "content": self.new}}
        return f"<tool_call>{json.dumps(payload)}</tool_call>"


def _path(header: str) -> str | None:
    name = header.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def _parse(patch: str) -> list[tuple[str | None, str | None, list[tuple[list[str], list[str]]]]]:
    """``(old path, new path, hunks)`` per file of a unified diff; a hunk is its (old lines, new lines),
    each line with its newline unless the diff says ``\\ No newline at end of file``."""
    files: list[tuple[str | None, str | None, list[tuple[list[str], list[str]]]]] = []
    lines = patch.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("Binary files ") or line.startswith("GIT binary patch"):
            raise UnsupportedPatch("binary files")
        if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            files.append((_path(line[4:]), _path(lines[index + 1][4:]), []))
            index += 2
            continue
        match = _HUNK.match(line)
        if match and files:
            # The header's counts say where the hunk ends (a removed line may itself start with "--").
            old_left = int(match.group(1) if match.group(1) is not None else 1)
            new_left = int(match.group(2) if match.group(2) is not None else 1)
            old: list[str] = []
            new: list[str] = []
            last: list[list[str]] = []
            index += 1
            while index < len(lines) and (old_left > 0 or new_left > 0 or lines[index].startswith("\\")):
                body = lines[index]
                if body.startswith("\\"):  # "\ No newline at end of file": the line before has none
                    for side in last:
                        side[-1] = side[-1].removesuffix("\n")
                    index += 1
                    continue
                kind, text = (body[:1] or " "), body[1:] + "\n"
                last = ([old] if kind in " -" else []) + ([new] if kind in " +" else [])
                for side in last:
                    side.append(text)
                old_left -= kind in " -"
                new_left -= kind in " +"
                index += 1
            files[-1][2].append((old, new))
            continue
        index += 1
    return files


def _trim(old: list[str], new: list[str], text: str) -> tuple[str, str]:
    """Drop the context lines both sides share at either end while what is left of ``old`` stays
    non-empty and occurs exactly once in ``text`` (what the ``edit`` tool requires)."""
    while len(old) > 1 and new and old[0] == new[0] and text.count("".join(old[1:])) == 1:
        old, new = old[1:], new[1:]
    while len(old) > 1 and new and old[-1] == new[-1] and text.count("".join(old[:-1])) == 1:
        old, new = old[:-1], new[:-1]
    return "".join(old), "".join(new)


def patch_edits(patch: str, read: Callable[[str], str]) -> list[Edit]:
    """The expert's edits for ``patch``, given ``read(path)``: a file's text before the patch.

    Raises :class:`UnsupportedPatch` for what ``edit`` and ``write_file`` cannot do, and when a
    hunk does not apply to the text ``read`` gives (its old lines are not there exactly once).
    """
    edits: list[Edit] = []
    for old_path, new_path, hunks in _parse(patch):
        if new_path is None:
            raise UnsupportedPatch(f"{old_path}: the patch deletes it")
        if old_path is None:
            edits.append(Edit(new_path, "", "".join(line for _, new in hunks for line in new)))
            continue
        if old_path != new_path:
            raise UnsupportedPatch(f"{old_path}: the patch renames it to {new_path}")
        text = read(old_path)
        for old_lines, new_lines in hunks:
            if text.count("".join(old_lines)) != 1:
                raise UnsupportedPatch(f"{old_path}: a hunk's old lines do not occur exactly once in the file")
            old, new = _trim(old_lines, new_lines, text)
            edits.append(Edit(old_path, old, new))
            text = text.replace(old, new, 1)  # later hunks apply to the edited text, as the tool would
    if not edits:
        raise UnsupportedPatch("the patch changes nothing")
    return edits


def fix_reply(edits: Sequence[Edit], context: str, *, compaction_prompt: str, summary_header: str) -> str:
    """The expert's next message in ``context`` (the current segment's text, up to its turn).

    It reads every file it will edit (all at once), then makes its edits in order (those to
    different files in one turn: calls in one turn run in parallel, and two edits of one file must
    not race), then answers. Asked to compact, it writes ``edits N`` (how many it has made).
    """
    summary = context.split(summary_header, 1)[1] if summary_header and summary_header in context else ""
    found = re.search(r"edits (\d+)", summary)
    done = (int(found.group(1)) if found else 0) + context.count('"name": "edit"') + \
        context.count('"name": "write_file"')
    if asked_to_compact(context, compaction_prompt):
        return f"edits {done}"
    to_read = list(dict.fromkeys(edit.path for edit in edits if edit.old))
    if to_read and not summary and '"name": "read_file"' not in context:
        calls = [{"name": "read_file", "arguments": {"path": path}} for path in to_read]
        return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)
    batch: list[Edit] = []
    for edit in edits[done:]:
        if any(edit.path == other.path for other in batch):
            break
        batch.append(edit)
    if batch:
        return "".join(edit.call() for edit in batch)
    return "fixed " + " ".join(dict.fromkeys(edit.path for edit in edits))
