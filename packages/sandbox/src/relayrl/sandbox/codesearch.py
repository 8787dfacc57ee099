"""The code-search environment: a question about a small repository, answered with a set of files.

A task has ``kind = "code-search"``, a ``workspace`` (the repository the agent explores with the
read-only tools) and ``answer`` (the list of files that answer it). The agent's final message names
files, one per line or separated by commas or spaces; reward is the F1 of that set against the
ground truth, so naming every file in the repository is not rewarded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from relayrl.core.wire import TaskSpec

__all__ = ["f1_score", "grade_code_search", "parse_file_answer"]

_TOKEN = re.compile(r"[\w.\-/]+")
_EXTENSIONS = {"py", "pyi", "md", "rst", "txt", "toml", "cfg", "ini", "json", "yaml", "yml", "js", "ts", "c", "h",
               "cc", "cpp", "hpp", "rs", "go", "java", "sh", "sql", "html", "css", "lock"}


def parse_file_answer(text: str) -> set[str]:
    """File paths named in ``text``: tokens with a ``/`` or a source-file extension (``./`` removed).

    ``os.environ.get`` in a pasted grep line is not a file; ``setup.py`` and ``shop/api.py`` are.
    """
    paths = set()
    for token in _TOKEN.findall(text.replace("`", " ")):
        token = token.rstrip(".")
        token = token[2:] if token.startswith("./") else token
        extension = token.rsplit(".", 1)[-1] if "." in token.rsplit("/", 1)[-1] else ""
        if extension in _EXTENSIONS:
            paths.add(token)
    return paths


def f1_score(predicted: Iterable[str], truth: Iterable[str]) -> float:
    """F1 of two sets; 1.0 when both are empty."""
    predicted, truth = set(predicted), set(truth)
    if not predicted and not truth:
        return 1.0
    hits = len(predicted & truth)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(truth)
    return 2 * precision * recall / (precision + recall)


def grade_code_search(task: TaskSpec, answer_text: str) -> tuple[float, dict[str, object]]:
    """``(reward, report)`` for an answer to a code-search task."""
    if task.kind != "code-search":
        raise ValueError(f"task {task.task_id}: kind is {task.kind!r}, not 'code-search'")
    truth = {path.removeprefix("./") for path in (task.answer or [])}
    predicted = parse_file_answer(answer_text)
    reward = f1_score(predicted, truth)
    return reward, {"predicted": sorted(predicted), "truth": sorted(truth), "missing": sorted(truth - predicted),
                    "extra": sorted(predicted - truth)}
