"""``relayrl data filter``: keep the tasks whose measured pass rate lies in a band.

Each task of SET is evaluated with ``relayrl eval``'s machinery (``--samples`` per task), or its
records are read from an earlier eval's output (``--records DIR``: the eval continues there, so
tasks it already graded are not graded again). The tasks that satisfy ``--keep`` are written as a
task set (JSONL, one TaskSpec per line, ``relayrl.sandbox.load_tasks`` reads it) with their
measured ``pass_rate``, ``passed`` and ``samples`` in ``metadata``: a training set neither always
solved nor never solved (the buffer's zero-variance filter drops such groups during a run; this
moves the choice ahead of it).
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.errors import RelayrlError

__all__ = ["KEEP_NAMES", "parse_keep", "write_task_set"]

KEEP_NAMES = ("pass_rate", "mean_reward", "passed", "samples")
"""What a ``--keep`` condition may name (per task, from the eval)."""

_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}


def parse_keep(text: str) -> Callable[[dict[str, float]], bool]:
    """A condition such as ``0.1 <= pass_rate <= 0.9`` (comparisons joined by ``and``/``or``) as a predicate.

    Only numbers, the names in :data:`KEEP_NAMES`, comparisons, ``and``, ``or`` and ``not`` are
    accepted: the text is parsed, never executed.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise RelayrlError(f"--keep {text!r}: not a condition (e.g. \"0.1 <= pass_rate <= 0.9\")") from None

    def build(node: ast.AST) -> Callable[[dict[str, float]], Any]:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, (ast.And, ast.Or)):
            parts = [build(value) for value in node.values]
            if isinstance(node.op, ast.And):
                return lambda row: all(part(row) for part in parts)
            return lambda row: any(part(row) for part in parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = build(node.operand)
            return lambda row: not inner(row)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            terms = [build(node.left), *(build(value) for value in node.comparators)]
            ops = [_COMPARE[type(op)] for op in node.ops]
            return lambda row: all(op(terms[i](row), terms[i + 1](row)) for i, op in enumerate(ops))
        if isinstance(node, ast.Name) and node.id in KEEP_NAMES:
            return lambda row: row[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return lambda row: node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return lambda row: -node.operand.value
        raise RelayrlError(f"--keep {text!r}: {ast.unparse(node)!r} is not allowed (comparisons of numbers and "
                           f"{', '.join(KEEP_NAMES)}, joined by and/or)")

    predicate = build(tree)
    if not isinstance(tree, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
        raise RelayrlError(f"--keep {text!r}: not a condition (e.g. \"0.1 <= pass_rate <= 0.9\")")
    return lambda row: bool(predicate(row))


def task_rows(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per task id, the values a ``--keep`` condition can name."""
    return {task["task_id"]: {"pass_rate": task["passed"] / task["samples"], "mean_reward": task["mean_reward"],
                              "passed": task["passed"], "samples": task["samples"]} for task in summary["tasks"]}


def write_task_set(tasks: list[Any], rows: dict[str, dict[str, float]], keep: Callable[[dict[str, float]], bool],
                   out: Path) -> list[Any]:
    """Write the kept tasks (with their measured numbers in ``metadata``) to ``out`` as JSONL; return them."""
    kept = []
    for task in tasks:
        row = rows.get(task.task_id)
        if row is None or not keep(row):
            continue
        metadata = {**task.metadata, "pass_rate": row["pass_rate"], "passed": row["passed"], "samples": row["samples"]}
        kept.append(msgspec.structs.replace(task, metadata=metadata))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(json.dumps(msgspec.to_builtins(task)) + "\n" for task in kept))
    partial.replace(out)
    return kept


def histogram(rows: dict[str, dict[str, float]]) -> str:
    """Tasks per pass-rate band, one line: ``0: 12 | (0, 0.25]: 30 | ...``."""
    bands = [("0", lambda r: r == 0), ("(0, 0.25]", lambda r: 0 < r <= 0.25), ("(0.25, 0.5]", lambda r: 0.25 < r <= 0.5),
             ("(0.5, 0.75]", lambda r: 0.5 < r <= 0.75), ("(0.75, 1)", lambda r: 0.75 < r < 1), ("1", lambda r: r == 1)]
    return " | ".join(f"{name}: {sum(test(row['pass_rate']) for row in rows.values())}" for name, test in bands)
