"""``relayrl data verify``: gold must pass, empty must fail, mutated gold should fail."""

from __future__ import annotations

import json
import shutil

import msgspec

from relayrl.sandbox.grading import Grader
from relayrl.sandbox.verify import main, mutate_patch, verify_tasks


def test_mutants_change_one_added_line_each(tasks):
    gold = tasks["leap-year"].gold_patch
    mutants = mutate_patch(gold)
    assert 1 <= len(mutants) <= 3 and len(set(mutants)) == len(mutants)
    for mutant in mutants:
        changed = [(a, b) for a, b in zip(gold.splitlines(), mutant.splitlines()) if a != b]
        assert len(changed) == 1 and changed[0][0].startswith("+")
    assert mutate_patch("diff --git a/x b/x\n") == []


def test_the_shipped_tasks_verify(backend, tasks):
    rows = verify_tasks([tasks["median"], tasks["roman"]], Grader(backend))
    assert [(row.gold_passes, row.empty_fails, row.mutant_fails, row.fit) for row in rows] == [(True, True, True, True)] * 2


def test_broken_tasks_are_caught(backend, tasks, tmp_path):
    good = tasks["median"]
    wrong_gold = msgspec.structs.replace(good, task_id="wrong-gold", gold_patch=tasks["roman"].gold_patch)
    weak = tmp_path / "weak"
    shutil.copytree(good.hidden_tests, weak)
    (weak / "tests" / "test_grading.py").write_text("import unittest\n\nclass T(unittest.TestCase):\n"
                                                    "    def test_nothing(self):\n        pass\n")
    passes_empty = msgspec.structs.replace(good, task_id="passes-empty", hidden_tests=str(weak))
    rows = {row.task_id: row for row in verify_tasks([wrong_gold, passes_empty], Grader(backend))}
    assert rows["wrong-gold"].gold_passes is False and not rows["wrong-gold"].fit
    assert "false negatives" in rows["wrong-gold"].note
    assert rows["passes-empty"].empty_fails is False and not rows["passes-empty"].fit
    assert "false positives" in rows["passes-empty"].note


def test_main_prints_a_table_and_writes_the_fit_list(backend, tasks, tmp_path, capsys):
    chosen = [tasks["chunks"], msgspec.structs.replace(tasks["chunks"], task_id="no-gold", gold_patch=None)]
    with open(tmp_path / "tasks.jsonl", "w") as handle:
        for task in chosen:
            handle.write(json.dumps(msgspec.to_builtins(task)) + "\n")
    out = tmp_path / "fit.txt"
    status = main([str(tmp_path / "tasks.jsonl"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 1 and "1 of 2 tasks fit for training" in printed and "no gold patch" in printed
    assert out.read_text() == "chunks\n"


def test_main_reports_user_errors_on_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nothing.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("relayrl: error: ")
