"""``relayrl data verify TASKS``: keep only tasks whose verifier can be trusted.

For every task with a grading command, in its real grading sandbox:

* the **gold patch must pass**: otherwise the verifier rejects a valid solution (false negatives);
* the **empty patch must fail**: otherwise it accepts doing nothing (false positives);
* a **mutated gold patch should fail**: small semantic changes to the gold patch's added lines
  (a comparison, an arithmetic operator, a constant); if every such mutant still passes, the hidden
  tests are too weak to tell a near miss from a fix.

Prints a table and writes the ids of the tasks fit for training, one per line::

    relayrl data verify packages/environments/src/relayrl/environments/tasks/bugfix --out fit.txt
    python -m relayrl.sandbox.verify TASKS --backend bwrap
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from relayrl.core.config import load_config
from relayrl.core.errors import RelayrlError
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import TaskSpec
from relayrl.sandbox.config import SandboxSection, open_backend
from relayrl.sandbox.grading import Grader
from relayrl.sandbox.task_sources import load_tasks

__all__ = ["VerifyRow", "add_arguments", "main", "mutate_patch", "run", "verify_tasks"]

_MUTATIONS: list[tuple[str, str]] = [
    (r"<=", "<"), (r">=", ">"), (r"(?<![<>=!])<(?!=)", "<="), (r"(?<![<>=!-])>(?!=)", ">="), (r"==", "!="),
    (r"!=", "=="), (r"\+ 1\b", "+ 2"), (r"- 1\b", "- 2"), (r"(?<![\w.])1(?![\w.])", "2"), (r"(?<![\w.])0(?![\w.])", "1"),
    (r"\band\b", "or"), (r"\bor\b", "and"), (r"\bTrue\b", "False"), (r"\bFalse\b", "True"), (r" \+ ", " - "),
    (r" - ", " + "), (r" \* ", " + "), (r"\bmin\(", "max("), (r"\bmax\(", "min("), (r"\.(lower|upper|strip)\(\)", ""),
]


def _added_lines(lines: list[str]) -> list[int]:
    return [index for index, line in enumerate(lines) if line.startswith("+") and not line.startswith("+++")
            and line[1:].strip() and not line[1:].lstrip().startswith("#")]


def mutate_patch(patch: str, *, limit: int = 3) -> list[str]:
    """Up to ``limit`` near misses of a gold patch: one added line changed by one operator mutation each.

    Some mutants are equivalent to the gold patch (``x > high`` vs ``x >= high`` in a clamp), so a
    task fails verification only when *every* mutant passes. When no operator applies, the fallback
    mutant deletes one added line.
    """
    lines = patch.splitlines(keepends=True)
    added = _added_lines(lines)
    mutants: list[str] = []
    for pattern, replacement in _MUTATIONS:
        for index in added:
            code = lines[index][1:]
            mutated, count = re.subn(pattern, replacement, code, count=1)
            if count and mutated != code:
                candidate = "".join([*lines[:index], "+" + mutated, *lines[index + 1:]])
                if candidate not in mutants:
                    mutants.append(candidate)
                break
        if len(mutants) >= limit:
            return mutants
    if not mutants and added:
        index = added[-1]
        mutants.append("".join([*lines[:index], *lines[index + 1:]]).replace(
            _hunk_header(lines, index), _shrink_header(_hunk_header(lines, index)), 1))
    return mutants


def _hunk_header(lines: list[str], index: int) -> str:
    return next(line for line in reversed(lines[:index]) if line.startswith("@@"))


def _shrink_header(header: str) -> str:
    """The hunk header with the new side one line shorter (one added line was deleted)."""
    match = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", header)
    if not match:
        return header
    new_count = int(match.group(4) or 1) - 1
    return header.replace(match.group(0), f"@@ -{match.group(1)},{match.group(2) or 1} +{match.group(3)},{new_count} @@", 1)


@dataclasses.dataclass(frozen=True)
class VerifyRow:
    """One task's verification."""

    task_id: str
    gold_passes: bool | None
    empty_fails: bool | None
    mutant_fails: bool | None
    """Whether at least one mutant of the gold patch failed; None when none could be made."""
    mutants_killed: str = ""
    """``killed/made`` mutants, for the table."""
    note: str = ""

    @property
    def fit(self) -> bool:
        return bool(self.gold_passes) and bool(self.empty_fails) and self.mutant_fails is not False


def verify_tasks(tasks: Sequence[TaskSpec], grader: Grader) -> list[VerifyRow]:
    """Verify each task (gold, empty and mutated gold graded in one grading sandbox per task)."""
    rows = []
    for task in tasks:
        if not task.grading_command:
            rows.append(VerifyRow(task.task_id, None, None, None, note="no grading command (not a sandbox-graded task)"))
            continue
        if not task.gold_patch:
            rows.append(VerifyRow(task.task_id, None, None, None, note="no gold patch"))
            continue
        mutants = mutate_patch(task.gold_patch)
        answers = [task.gold_patch, "", *mutants]
        try:
            reports = grader.grade_group(task, answers)
        except Exception as exc:  # one broken task must not stop the audit of the others
            rows.append(VerifyRow(task.task_id, None, None, None, note=f"error: {' '.join(str(exc).split())[:200]}"))
            continue
        gold, empty = reports[0], reports[1]
        killed = sum(not report.passed for report in reports[2:])
        mutant_fails = killed > 0 if mutants else None
        notes = []
        if not gold.passed:
            notes.append("gold fails: " + ("does not apply" if not gold.applied else "tests fail") + " (false negatives)")
        if empty.passed:
            notes.append("empty patch passes (false positives)")
        if mutant_fails is False:
            notes.append("every mutant of the gold patch passes (weak tests)")
        if not mutants:
            notes.append("no mutant could be made")
        rows.append(VerifyRow(task.task_id, gold.passed, not empty.passed, mutant_fails,
                              mutants_killed=f"{killed}/{len(mutants)}", note="; ".join(notes)))
    return rows


def format_table(rows: Sequence[VerifyRow]) -> str:
    def mark(value: bool | None) -> str:
        return {True: "ok", False: "FAIL", None: "-"}[value]

    width = max([len("task"), *(len(row.task_id) for row in rows)])
    lines = [f"{'task':<{width}}  gold-passes  empty-fails  mutants-killed  fit  note"]
    for row in rows:
        killed = f"{mark(row.mutant_fails)} {row.mutants_killed}".strip()
        lines.append(f"{row.task_id:<{width}}  {mark(row.gold_passes):<11}  {mark(row.empty_fails):<11}  "
                     f"{killed:<14}  {'yes' if row.fit else 'no':<3}  {row.note}")
    fit = sum(row.fit for row in rows)
    lines.append(f"{fit} of {len(rows)} tasks fit for training")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", metavar="TASKS", help="a task directory or JSONL file")
    parser.add_argument("--source", default=None, help="task source name (default: guessed from TASKS)")
    parser.add_argument("--backend", default=None, help="sandbox backend (default: [sandbox] backend, 'process')")
    parser.add_argument("--config", default=None, help="run config whose [sandbox] section to use")
    parser.add_argument("--out", default="fit-tasks.txt", help="where to write the ids of fit tasks")


def run(args: argparse.Namespace, *, pm: PluginManager | None = None) -> int:
    """Run the verification; exit status 0 when every task is fit, 1 otherwise."""
    section = SandboxSection()
    if args.config:
        section = load_config(args.config, pm=pm).sandbox
    tasks = load_tasks(args.tasks, source=args.source, pm=pm)
    grader = Grader(open_backend(args.backend, section=section, pm=pm), section=section, pm=pm)
    rows = verify_tasks(tasks, grader)
    print(format_table(rows))
    Path(args.out).write_text("".join(f"{row.task_id}\n" for row in rows if row.fit))
    print(f"wrote {args.out}")
    return 0 if all(row.fit for row in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m relayrl.sandbox.verify TASKS [--out FILE]``; errors print as one line."""
    parser = argparse.ArgumentParser(prog="relayrl data verify", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except RelayrlError as exc:
        print(f"relayrl: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
