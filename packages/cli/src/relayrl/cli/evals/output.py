"""An eval's summary as markdown tables and as an HTML page with the trajectories."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["markdown", "write_html"]

PER_TASK_ROWS = 20
"""Tasks listed in the printed summary (summary.md and index.html list all of them)."""


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _overall_table(summary: dict[str, Any], ks: Sequence[int]) -> tuple[list[str], list[str]]:
    overall = summary["overall"]
    header = ["tasks", "samples", *(f"pass@{k}" for k in ks), "mean reward", "tokens/sample", "tokens/solved",
              "engine-s/solved", "turns", "tool calls", "tool s", "flagged"]
    row = [_number(overall["tasks"]), _number(overall["samples"]), *(_number(overall[f"pass@{k}"]) for k in ks),
           _number(overall["mean_reward"]), _number(overall["tokens"], 1), _number(overall["tokens_per_solved"], 1),
           _number(overall["engine_seconds_per_solved"], 2), _number(overall["turns"], 2),
           _number(overall["tool_calls"], 2), _number(overall["tool_seconds"], 2),
           _number(overall["flagged_samples"])]
    for key, name in (("price_per_solved_tokens", "price/solved (tokens)"),
                      ("price_per_solved_engine_time", "price/solved (engine time)")):
        if key in overall:
            header.append(name)
            row.append(_number(overall[key], 6))
    return header, row


def _task_rows(summary: dict[str, Any], ks: Sequence[int]) -> tuple[list[str], list[list[str]]]:
    header = ["task", "passed", *(f"pass@{k}" for k in ks), "mean reward", "tokens", "turns", "tool calls",
              "tool s", "wall s", "flagged"]
    rows = [[task["task_id"], f"{task['passed']}/{task['samples']}", *(_number(task[f"pass@{k}"]) for k in ks),
             _number(task["mean_reward"]), _number(task["tokens"], 1), _number(task["turns"], 2),
             _number(task["tool_calls"], 2), _number(task["tool_seconds"], 2), _number(task["wall_seconds"], 2),
             _number(task["flagged"])] for task in summary["tasks"]]
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(summary: dict[str, Any], ks: Sequence[int], *, title: str, max_tasks: int | None = None) -> str:
    """The overall table, the per-task table (``max_tasks`` rows at most) and the flagged samples."""
    header, row = _overall_table(summary, ks)
    parts = [f"# {title}", "", _markdown_table(header, [row]), ""]
    if summary.get("by_category"):
        category_header = ["category", "tasks", "samples", *[f"pass@{k}" for k in ks], "mean reward"]
        category_rows = [[name, str(row["tasks"]), str(row["samples"]), *[f"{row[f'pass@{k}']:.3f}" for k in ks],
                          f"{row['mean_reward']:.3f}"] for name, row in summary["by_category"].items()]
        parts += ["## Per category", "", _markdown_table(category_header, category_rows), ""]
    task_header, task_rows = _task_rows(summary, ks)
    shown = task_rows if max_tasks is None else task_rows[:max_tasks]
    more = len(task_rows) - len(shown)
    parts += ["## Per task" + (f" (first {len(shown)} of {len(task_rows)})" if more else ""), "",
              _markdown_table(task_header, shown), ""]
    flagged = summary["flagged"]
    if flagged:
        parts += [f"## Flagged samples ({len(flagged)}, counted as failed)", ""]
        parts += [f"- {item['task_id']} sample {item['sample']}: {', '.join(item['flags'])}" for item in flagged]
        parts.append("")
    return "\n".join(parts)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_html(out: Path, summary: dict[str, Any], ks: Sequence[int], *, title: str, model_dir: Path,
               viewer_tasks: int = 100) -> Path:
    """``index.html`` (tables, flagged samples) and ``trajectories.html`` (the first ``viewer_tasks``
    tasks' samples in the trajectory viewer); return the index's path."""
    header, row = _overall_table(summary, ks)
    task_header, task_rows = _task_rows(summary, ks)
    flagged = "".join(f"<li>{html.escape(item['task_id'])} sample {item['sample']}: "
                      f"{html.escape(', '.join(item['flags']))}</li>" for item in summary["flagged"])
    shown = _write_trajectories(out, summary, title=title, model_dir=model_dir, viewer_tasks=viewer_tasks)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>eval: {html.escape(title)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:16px}} table{{border-collapse:collapse;margin:8px 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child{{text-align:left}}</style>
</head><body>
<h2>{html.escape(title)}</h2>
{_html_table(header, [row])}
<p>pass@k: the unbiased estimator over each task's samples, averaged over tasks. tokens/solved and
engine-s/solved: generated tokens and the engines' wall-clock seconds per passing sample.</p>
<p><a href="trajectories.html">Trajectories</a> of the first {shown} task(s).</p>
<h3>Flagged samples ({len(summary["flagged"])}, counted as failed)</h3><ul>{flagged or "<li>none</li>"}</ul>
<h3>Per task</h3>
{_html_table(task_header, task_rows)}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path


def _write_trajectories(out: Path, summary: dict[str, Any], *, title: str, model_dir: Path, viewer_tasks: int) -> int:
    from relayrl.cli.view import render_page, trajectory_record
    from relayrl.core.wire import Group
    from relayrl.rollout.models import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    passed = {task["task_id"]: f"{task['passed']}/{task['samples']} passed" for task in summary["tasks"]}
    data = []
    for path in sorted((out / "groups").glob("*.msgpack")):
        if len(data) >= viewer_tasks:
            break
        group = msgspec.msgpack.decode(path.read_bytes(), type=Group)
        if group.task_id not in passed:
            continue
        data.append({"ref": group.group_id, "task": group.task_id, "step": None, "outcome": passed[group.task_id],
                     "trajectories": [trajectory_record(trajectory, tokenizer) for trajectory in group.trajectories]})
    (out / "trajectories.html").write_text(render_page(title, data))
    return len(data)
