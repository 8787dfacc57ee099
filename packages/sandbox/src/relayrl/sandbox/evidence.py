"""The host's half of evidence-based grading: the test inventory, the runner's payload, the verdict.

A test-graded answer earns reward only from *evidence*: the grading runner
(:mod:`relayrl.sandbox.grading_runner`, which runs inside the grading sandbox next to the answer)
reports one record per hidden test, each signed with a key the host makes for that answer alone.
The host decides what was expected (:func:`test_inventory`, from the hidden tests' source, never
from anything the sandbox says) and :func:`verify_records` accepts a verdict only when

* every line of the runner's stdout is a record whose HMAC verifies, in sequence from 0;
* the stream starts with ``start`` and ends with ``end`` (a premature exit, an ``exec``, a killed
  runner leave it incomplete);
* every expected test has exactly one ``result`` and it is ``passed`` (a missing, duplicated or
  extra result fails);
* no ``flag`` record was sent (runtime evidence of cheating);
* the runner says it is non-dumpable (else the answer's processes could have ptraced it: fail closed).

Anything else earns 0, and a forged or malformed line is itself a cheating flag: only the answer's
code could have written it.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from relayrl.sandbox import grading_runner, split_runner

__all__ = ["RUNNER_SOURCE", "SPLIT_RUNNER_SOURCE", "Evidence", "is_test_module", "new_key", "read_records",
           "runner_payload", "test_inventory", "verify_records"]

RUNNER_SOURCE = Path(grading_runner.__file__).read_text(encoding="utf-8")
"""The in-process runner script, copied into each grading sandbox of an ``in-process`` verdict."""
SPLIT_RUNNER_SOURCE = Path(split_runner.__file__).read_text(encoding="utf-8")
"""The split runner script (:mod:`relayrl.sandbox.split_runner`), for ``split`` verdicts."""

_PREFIX = grading_runner.RECORD_PREFIX


def is_test_module(path: str) -> bool:
    """Whether hidden file ``path`` is a Python test module the runner loads (``test_*.py``, ``*_test.py``)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _module_name(path: str) -> str:
    return path[:-3].replace("/", ".")


def _is_unittest_class(node: ast.ClassDef) -> bool:
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
        if name.endswith("TestCase"):
            return True
    return False


def test_inventory(modules: Mapping[str, str]) -> list[str]:
    """The ids of the tests in hidden test ``modules`` (path -> source), as the runner names them.

    ``module.Class.test_name`` for methods named ``test*`` of classes deriving from a ``TestCase``
    or named ``Test*`` (pytest's convention), ``module.test_name`` for module-level functions.
    Computed from the source alone: what the answer's code does at run time cannot add or remove
    an expected test.
    """
    inventory = []
    for path, source in sorted(modules.items()):
        module = _module_name(path)
        tree = ast.parse(source, path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                inventory.append(f"{module}.{node.name}")
            elif isinstance(node, ast.ClassDef) and (_is_unittest_class(node) or node.name.startswith("Test")):
                methods = [item.name for item in node.body
                           if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]
                inventory += [f"{module}.{node.name}.{method}" for method in methods]
    return inventory


def runner_payload(*, key: bytes, root: str, modules: Mapping[str, str], inventory: Sequence[str],
                   **options: object) -> bytes:
    """The JSON a runner reads on stdin (the key travels no other way); ``options``: the split runner's
    (``python``, ``test_timeout_s``)."""
    return json.dumps({"key": key.hex(), "root": root, "modules": dict(modules), "inventory": list(inventory),
                       **options}).encode()


def new_key() -> bytes:
    """A fresh HMAC key for one answer's records."""
    return os.urandom(32)


@dataclasses.dataclass
class Evidence:
    """What the records prove about one answer."""

    passed: bool = False
    results: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """test id -> (outcome, detail)."""
    flags: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(detector, evidence): runtime flags from the runner and forgeries seen by the host."""
    problems: list[str] = dataclasses.field(default_factory=list)
    """Why the verdict is not a pass, for humans (never shown to the policy)."""
    protections: str = ""

    @property
    def tests_passed(self) -> int:
        return sum(outcome == "passed" for outcome, _ in self.results.values())


def _parse(line: str, key: bytes, expected_seq: int) -> tuple[str, ...] | None:
    parts = line.split(" ", 3)
    if len(parts) != 4 or parts[0] != _PREFIX or parts[1] != str(expected_seq):
        return None
    body = parts[3]
    mac = hmac.new(key, f"{parts[1]}|{body}".encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, parts[2]):
        return None
    try:
        fields = ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(fields, tuple) or not fields or not all(isinstance(field, str) for field in fields):
        return None
    return fields


def read_records(stdout: str, *, key: bytes) -> list[tuple[str, ...]]:
    """The valid records of a runner's stdout, in sequence, up to the first line that is not one (for
    the grader's own runs of the gold solution: ``call`` and ``probe`` records)."""
    records = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = _parse(line, key, len(records))
        if fields is None:
            break
        records.append(fields)
    return records


def verify_records(stdout: str, *, key: bytes, inventory: Sequence[str]) -> Evidence:
    """Check the runner's stdout against the inventory; see the module docstring for the rules."""
    evidence = Evidence()
    seq = 0
    started = ended = False
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = _parse(line, key, seq) if not ended else None
        if fields is None:
            evidence.flags.append(("forged-evidence", f"a line on the runner's record stream is not a valid record: "
                                                      f"{line[:120]!r}"))
            continue
        seq += 1
        kind = fields[0]
        if kind == "start":
            if started:
                evidence.problems.append("two start records")
            started = True
            evidence.protections = fields[2] if len(fields) > 2 else ""
            if len(fields) > 2 and fields[2] == "unsupported":
                evidence.problems.append(f"the sandbox's python3 ({fields[3] if len(fields) > 3 else '?'}) is too old "
                                         f"for the grading runner (needs 3.10+)")
        elif kind == "result" and len(fields) >= 3:
            test_id, outcome = fields[1], fields[2]
            detail = fields[3] if len(fields) > 3 else ""
            if test_id in evidence.results:
                evidence.problems.append(f"{test_id}: reported twice")
                evidence.results[test_id] = ("duplicated", detail)
            else:
                evidence.results[test_id] = (outcome, detail)
        elif kind == "flag" and len(fields) >= 3:
            evidence.flags.append((fields[1], fields[2]))
        elif kind == "load-error" and len(fields) >= 3:
            evidence.problems.append(f"hidden test module {fields[1]} did not load: {fields[2]}")
        elif kind == "crash":
            evidence.problems.append(f"the grading runner crashed: {fields[1] if len(fields) > 1 else '?'}")
        elif kind == "end":
            ended = True
        else:
            evidence.problems.append(f"unknown record {kind!r}")
    if not started:
        evidence.problems.append("no start record: the runner did not run or its output was replaced")
    if not ended:
        evidence.problems.append("no end record: the runner was stopped before it finished (exit, exec, kill, timeout)")
    expected = set(inventory)
    for test_id in inventory:
        outcome, detail = evidence.results.get(test_id, ("missing", "no result record"))
        if outcome != "passed":
            evidence.problems.append(f"{test_id}: {outcome}{': ' + detail if detail else ''}")
    extra = sorted(set(evidence.results) - expected)
    if extra:
        evidence.problems.append(f"results for tests that were not expected: {', '.join(extra[:5])}")
    if not inventory:
        evidence.problems.append("the hidden tests define no test")
    if started and "non-dumpable" not in evidence.protections.split(","):
        # Fail closed: a runner other processes of the sandbox could ptrace proves nothing.
        evidence.problems.append("the grading runner could not make itself non-dumpable: its records prove nothing")
    evidence.passed = not evidence.problems and not evidence.flags
    return evidence
