"""Workspace preparation strips history and reference artifacts; diffs are computed without git."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayrl.core.wire import TaskSpec
from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.config import DEFAULT_REFERENCE_GLOBS
from relayrl.sandbox.workspace import (
    GIT_ENV,
    INITIAL_COMMIT_MESSAGE,
    apply_patch_locally,
    matches_any,
    prepare_workspace,
    workspace_diff,
)


def git(cwd: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "code.py").write_text("def f():\n    return 1\n")
    (root / "SOLUTION.md").write_text("the answer\n")
    (root / "pkg" / "code.py.orig").write_text("backup\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "code.cpython-311.pyc").write_bytes(b"\0")
    (root / "tests").mkdir()
    (root / "tests" / "test_hidden.py").write_text("leaked hidden test\n")
    return root


@pytest.fixture
def hidden(tmp_path) -> Path:
    (tmp_path / "hidden" / "tests").mkdir(parents=True)
    (tmp_path / "hidden" / "tests" / "test_hidden.py").write_text("assert True\n")
    return tmp_path / "hidden"


def test_directory_workspace_is_copied_stripped_and_committed_once(tmp_path, hidden):
    source = make_repo(tmp_path / "src")
    task = TaskSpec(task_id="t", instruction="", workspace=str(source), hidden_tests=str(hidden),
                    reference_globs=["**/extra-ref.txt"])
    (source / "extra-ref.txt").write_text("task-specific reference\n")
    removed = prepare_workspace(task, tmp_path / "ws", reference_globs=DEFAULT_REFERENCE_GLOBS)
    ws = tmp_path / "ws"
    assert sorted(removed) == ["SOLUTION.md", "extra-ref.txt", "pkg/__pycache__", "pkg/code.py.orig",
                               "tests/test_hidden.py"]
    assert (ws / "pkg" / "code.py").exists() and not (ws / "tests" / "test_hidden.py").exists()
    assert git(ws, "log", "--format=%s").splitlines() == [INITIAL_COMMIT_MESSAGE]
    assert git(ws, "status", "--porcelain") == ""
    (ws / "pkg" / "code.py").write_text("def f():\n    return 2\n")
    assert "+    return 2" in git(ws, "diff")  # the agent can diff its own work


def test_git_history_does_not_leak(tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "--quiet")
    (origin / "fix.py").write_text("THE FIX\n")
    git(origin, "add", ".")
    git(origin, "commit", "--quiet", "-m", "the fix")
    (origin / "fix.py").unlink()
    (origin / "bug.py").write_text("bug\n")
    git(origin, "add", "-A")
    git(origin, "commit", "--quiet", "-m", "remove the fix")
    fixed_blob = git(origin, "rev-parse", "HEAD~1:fix.py").strip()
    ws = tmp_path / "ws"
    prepare_workspace(TaskSpec(task_id="t", instruction="", workspace=str(origin)), ws)
    assert git(ws, "log", "--format=%s").splitlines() == [INITIAL_COMMIT_MESSAGE]
    assert sorted(path.name for path in ws.iterdir()) == [".git", "bug.py"]
    result = subprocess.run(["git", "cat-file", "-p", fixed_blob], cwd=ws, capture_output=True, text=True)
    assert result.returncode != 0 and "THE FIX" not in result.stdout
    ws_rev = tmp_path / "ws-rev"
    prepare_workspace(TaskSpec(task_id="t", instruction="", workspace=f"{origin}@HEAD~1"), ws_rev)
    assert (ws_rev / "fix.py").read_text() == "THE FIX\n"
    assert git(ws_rev, "log", "--format=%s").splitlines() == [INITIAL_COMMIT_MESSAGE]


def test_tarball_workspace_and_its_history_are_handled(tmp_path):
    source = make_repo(tmp_path / "src")
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref: refs/heads/old\n")
    archive = tmp_path / "repo.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        handle.add(source, arcname=".")
    ws = tmp_path / "ws"
    prepare_workspace(TaskSpec(task_id="t", instruction="", workspace=str(archive)), ws,
                      reference_globs=DEFAULT_REFERENCE_GLOBS)
    assert (ws / "pkg" / "code.py").exists() and not (ws / "SOLUTION.md").exists()
    assert git(ws, "log", "--format=%s").splitlines() == [INITIAL_COMMIT_MESSAGE]


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(SandboxError, match="nowhere"):
        prepare_workspace(TaskSpec(task_id="t", instruction="", workspace=str(tmp_path / "nowhere")), tmp_path / "ws")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SandboxError, match="not empty"):
        prepare_workspace(TaskSpec(task_id="t", instruction=""), tmp_path / "full")


@pytest.mark.parametrize("path, expected", [
    ("SOLUTION.md", True), ("docs/solution.txt", True), ("a/b/c.orig", True), ("reference/x.py", True),
    ("pkg/reference/x.py", True), ("pkg/code.py", False), ("tests/test_x.py", False), ("fix.patch", True),
])
def test_default_reference_globs(path, expected):
    assert matches_any(path, DEFAULT_REFERENCE_GLOBS) is expected


def test_diff_round_trips_edits_additions_deletions_modes_and_symlinks(tmp_path):
    before = tmp_path / "before"
    (before / "pkg").mkdir(parents=True)
    (before / "pkg" / "a.py").write_text("one\ntwo\nthree\n")
    (before / "gone.txt").write_text("bye\n")
    (before / "script.sh").write_text("echo\n")
    (before / "no-newline.txt").write_text("last")
    after = tmp_path / "after"
    shutil.copytree(before, after, symlinks=True)
    (after / "pkg" / "a.py").write_text("one\nTWO\nthree\n")
    (after / "gone.txt").unlink()
    (after / "new" / "deep").mkdir(parents=True)
    (after / "new" / "deep" / "b.py").write_text("new file\n")
    (after / "script.sh").chmod(0o755)
    (after / "no-newline.txt").write_text("last, changed")
    os.symlink("pkg/a.py", after / "link")
    diff = workspace_diff(before, after)
    target = tmp_path / "target"
    shutil.copytree(before, target, symlinks=True)
    apply_patch_locally(target, diff)
    assert workspace_diff(target, after) == ""
    assert os.readlink(target / "link") == "pkg/a.py"
    assert workspace_diff(before, before) == ""


def test_diff_never_runs_git_in_the_agents_tree(tmp_path):
    before = tmp_path / "before"
    before.mkdir()
    (before / "a.txt").write_text("a\n")
    after = tmp_path / "after"
    shutil.copytree(before, after)
    (after / ".git").mkdir()
    marker = tmp_path / "pwned"
    (after / ".git" / "config").write_text(f"[core]\n\tfsmonitor = touch {marker}\n")
    (after / "a.txt").write_text("b\n")
    diff = workspace_diff(before, after)
    assert "+b" in diff and ".git" not in diff
    assert not marker.exists()


def test_a_huge_file_costs_the_host_little_and_cannot_be_applied(tmp_path):
    from relayrl.sandbox.diffs import MAX_DIFF_FILE_BYTES

    before, after = tmp_path / "before", tmp_path / "after"
    for tree in (before, after):
        tree.mkdir()
        (tree / "same.bin").write_bytes(b"x" * (2 * MAX_DIFF_FILE_BYTES))  # big, unchanged: no diff
    (after / "huge.txt").write_bytes(b"a\n" * MAX_DIFF_FILE_BYTES)
    os.mkfifo(after / "pipe")  # a FIFO is neither read nor diffed
    diff = workspace_diff(before, after)
    assert "same.bin" not in diff and "pipe" not in diff
    assert "Binary files a/huge.txt and b/huge.txt differ" in diff and len(diff) < 1000


_LINES = st.sampled_from(["a\n", "b\n", "c\n", "\n", "same\n", "x = 1\n", "last"])


def _text(lines: list[str]) -> str:
    # Only a file's last line may lack its newline.
    return "".join(line if line.endswith("\n") or index == len(lines) - 1 else line + "\n"
                   for index, line in enumerate(lines))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.lists(_LINES, max_size=30), new=st.lists(_LINES, max_size=30), replace_whole=st.booleans())
def test_any_edit_round_trips_through_git_apply(tmp_path_factory, monkeypatch, old, new, replace_whole):
    """Edits anywhere (heads and tails shared or not, last lines without newlines) apply to the exact
    new text, whether the changed region is diffed line by line or replaced whole."""
    import relayrl.sandbox.diffs as diffs

    monkeypatch.setattr(diffs, "MAX_DIFFED_LINES", 0 if replace_whole else 20_000)
    root = tmp_path_factory.mktemp("edit")
    before, after, target = root / "before", root / "after", root / "target"
    for tree, lines in ((before, old), (after, new), (target, old)):
        tree.mkdir()
        (tree / "f.txt").write_text(_text(lines))
    apply_patch_locally(target, workspace_diff(before, after))
    assert (target / "f.txt").read_text() == _text(new)


def test_a_diff_costs_the_host_what_it_returns(tmp_path):
    """A one-line change in a file of half a million lines, and a new file of a million empty lines:
    the host holds the files' bytes and the output, not an object per line (before: ~95x the file)."""
    import tracemalloc

    from relayrl.sandbox.diffs import MAX_DIFF_FILE_BYTES

    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    lines = b"".join(b"%07d\n" % n for n in range(MAX_DIFF_FILE_BYTES // 8))
    (before / "big.txt").write_bytes(lines)
    shutil.copytree(before, after)
    (after / "big.txt").write_bytes(lines.replace(b"0065536\n", b"changed\n"))
    (after / "blank.txt").write_bytes(b"\n" * MAX_DIFF_FILE_BYTES)
    tracemalloc.start()
    try:
        diff = workspace_diff(before, after)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "-0065536\n+changed\n" in diff
    assert diff[diff.index("diff --git a/blank.txt"):].splitlines().count("+") == MAX_DIFF_FILE_BYTES
    # The diff is ~2 MiB; the two versions of big.txt are 1 MiB each (4 MiB as a str of them).
    assert peak < 4 * len(diff) + 8 * MAX_DIFF_FILE_BYTES, f"peak {peak / 2**20:.1f} MiB for a {len(diff)}-byte diff"
    target = tmp_path / "target"
    shutil.copytree(before, target)
    apply_patch_locally(target, diff)
    assert workspace_diff(target, after) == ""


def test_a_diff_too_large_to_grade_is_refused_and_does_not_apply(tmp_path, monkeypatch):
    import relayrl.sandbox.diffs as diffs

    monkeypatch.setattr(diffs, "MAX_DIFF_BYTES", 10_000)
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    for index in range(100):
        (after / f"file{index}.txt").write_text("x" * 200 + "\n")
    assert workspace_diff(before, after) == diffs.TOO_LARGE_ANSWER
    with pytest.raises(SandboxError, match="does not apply"):
        apply_patch_locally(before, diffs.TOO_LARGE_ANSWER)
    monkeypatch.setattr(diffs, "MAX_DIFF_ENTRIES", 50)
    monkeypatch.setattr(diffs, "MAX_DIFF_BYTES", 1 << 20)
    assert workspace_diff(before, after) == diffs.TOO_LARGE_ANSWER  # too many entries to walk
