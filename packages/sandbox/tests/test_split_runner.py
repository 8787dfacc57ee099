"""The split runner itself, outside a sandbox: what crosses between the tests' process and the answer's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from relayrl.sandbox import split_runner
from relayrl.sandbox.evidence import test_inventory as inventory_of
from relayrl.sandbox.evidence import verify_records

ANSWER = '''
class Undescribable(Exception):
    def __str__(self):
        raise RuntimeError("no text either")


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return True  # equal to anything: fine between its own objects, refused against the tests' data


def undescribable():
    raise Undescribable(object())


def apply(function, value):
    return function(value)


def sort_in_place(values):
    values.sort()


def always_equal():
    return Point(0, 0)
'''

TESTS = '''
import unittest

from pkg.mod import Point, always_equal, apply, sort_in_place, undescribable


class TestCrossing(unittest.TestCase):
    def test_an_undescribable_error_is_an_error_not_a_lost_worker(self):
        with self.assertRaises(RuntimeError):
            undescribable()

    def test_callbacks_and_in_place_changes(self):
        self.assertEqual(apply(lambda value: value * 2, 21), 42)
        values = [3, 1, 2]
        sort_in_place(values)
        self.assertEqual(values, [1, 2, 3])

    def test_answer_objects_compare_among_themselves(self):
        self.assertEqual(Point(1, 2), Point(3, 4))  # the answer's own __eq__, asked in its process
        self.assertEqual((Point(1, 2).x, Point(1, 2).y), (1, 2))

    def test_an_answer_object_against_the_tests_data_is_refused(self):
        self.assertEqual(always_equal(), 5)
'''


def run(tmp_path: Path) -> dict[str, tuple[str, str]]:
    root = tmp_path / "run"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(ANSWER)
    modules = {"tests/test_crossing.py": TESTS}
    inventory = inventory_of(modules)
    key = b"k" * 32
    payload = {"key": key.hex(), "root": str(root), "modules": modules, "inventory": inventory,
               "python": sys.executable, "repository": ["pkg"]}
    result = subprocess.run([sys.executable, "-I", "-B", split_runner.__file__], input=json.dumps(payload).encode(),
                            capture_output=True, cwd=root, timeout=120)
    evidence = verify_records(result.stdout.decode(), key=key, inventory=inventory)
    assert "non-dumpable" in evidence.protections.split(","), result.stderr.decode()[-2000:]
    return {test_id.rsplit(".", 1)[1]: outcome for test_id, outcome in evidence.results.items()}


def test_what_crosses_between_the_tests_and_the_answer(tmp_path):
    outcomes = run(tmp_path)
    assert outcomes["test_an_undescribable_error_is_an_error_not_a_lost_worker"][0] == "passed"
    assert outcomes["test_callbacks_and_in_place_changes"][0] == "passed"
    assert outcomes["test_answer_objects_compare_among_themselves"][0] == "passed"
    refused = outcomes["test_an_answer_object_against_the_tests_data_is_refused"]
    assert refused[0] == "error" and "Unverifiable" in refused[1], refused
