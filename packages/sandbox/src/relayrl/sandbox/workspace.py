"""Workspace preparation (what the agent starts from) and diffs (what the agent hands in).

:func:`prepare_workspace` copies a task's workspace (a directory, a tarball, or a git repository,
optionally ``path@revision``), deletes reference artifacts matching the globs and anything at the
paths of the hidden tests, then replaces the git history with a single commit of that state: the
agent can ``git diff`` its own work, and no earlier commit (the fix, the tests) can leak.

:func:`workspace_diff` computes the agent's answer as a git-style diff of the pristine tree and the
final workspace, on the host, without running git in the agent's tree: a planted ``.git/config``
(``core.fsmonitor``, hooks, aliases) must never execute on the host, and a forged history must not
hide edits.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

from relayrl.core.wire import TaskSpec
from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.paths import walk_beneath

__all__ = ["GIT_ENV", "INITIAL_COMMIT_MESSAGE", "apply_patch_locally", "hidden_test_paths", "matches_any",
           "prepare_workspace", "strip_artifacts", "task_private_paths", "workspace_diff"]

INITIAL_COMMIT_MESSAGE = "initial state"

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "relayrl",
           "GIT_AUTHOR_EMAIL": "relayrl@localhost", "GIT_COMMITTER_NAME": "relayrl",
           "GIT_COMMITTER_EMAIL": "relayrl@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z", "GIT_TERMINAL_PROMPT": "0"}
"""A fixed identity and date make the initial commit's hash depend on the files alone."""


def _git(args: list[str], cwd: Path) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), **GIT_ENV}
    result = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd, env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} in {cwd}: {result.stderr.strip()}")
    return result.stdout


def matches_any(path: str, globs: Iterable[str]) -> bool:
    """Whether workspace-relative ``path`` matches a glob (``**/`` also matches at the top level)."""
    for pattern in globs:
        candidates = {pattern}
        if pattern.startswith("**/"):
            candidates.add(pattern[3:])
        for candidate in candidates:
            if fnmatch.fnmatchcase(path, candidate):
                return True
            if candidate.endswith("/**") and (path == candidate[:-3] or fnmatch.fnmatchcase(path, candidate[:-3])):
                return True
    return False


def strip_artifacts(root: Path, globs: Iterable[str], *, hidden_paths: Iterable[str] = ()) -> list[str]:
    """Delete every entry of ``root`` matching ``globs`` or listed in ``hidden_paths``; return them."""
    globs, hidden = list(globs), set(hidden_paths)
    removed = []
    for relative, info in list(walk_beneath(str(root))):
        if relative == ".git" or relative.startswith(".git/"):
            continue
        if matches_any(relative, globs) or relative in hidden:
            target = root / relative
            if not os.path.lexists(target):
                continue  # inside a directory removed already
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(target)
            else:
                target.unlink()
            removed.append(relative)
    return removed


def _copy_source(source: str, destination: Path) -> None:
    location, _, revision = source.partition("@") if "@" in source and not Path(source).exists() else (source, "", "")
    path = Path(location)
    if path.is_dir() and not (path / ".git").exists() and not location.endswith(".git"):
        shutil.copytree(path, destination, symlinks=True, dirs_exist_ok=True)
    elif path.is_file() and tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            _extract_safely(archive, destination)
    elif path.is_dir() or location.endswith(".git"):
        clone = destination.parent / f".{destination.name}-clone"
        try:
            _git(["clone", "--quiet", "--no-hardlinks", location, str(clone)], destination.parent)
            if revision:
                _git(["checkout", "--quiet", revision], clone)
            shutil.rmtree(clone / ".git")
            shutil.copytree(clone, destination, symlinks=True, dirs_exist_ok=True)
        finally:
            shutil.rmtree(clone, ignore_errors=True)
    else:
        raise SandboxError(f"workspace {source!r}: not a directory, tarball or git repository")


def _extract_safely(archive: tarfile.TarFile, destination: Path) -> None:
    """Unpack refusing absolute paths, '..', links out of the tree and device files."""
    if hasattr(tarfile, "data_filter"):  # Python 3.11.4+ and security back-ports
        archive.extractall(destination, filter="data")
        return
    for member in archive.getmembers():
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir() or member.issym()):
            raise SandboxError(f"tarball member {member.name!r}: absolute, '..' or not a file, directory or symlink")
        if member.issym() and (member.linkname.startswith("/") or ".." in Path(member.linkname).parts):
            raise SandboxError(f"tarball member {member.name!r}: a symlink out of the tree ({member.linkname})")
    archive.extractall(destination)


def hidden_test_paths(task: TaskSpec) -> list[str]:
    """Workspace-relative paths the task's hidden tests occupy (they are overlaid at the root)."""
    if not task.hidden_tests:
        return []
    root = Path(task.hidden_tests)
    if not root.is_dir():
        raise SandboxError(f"task {task.task_id}: hidden_tests {root} is not a directory")
    # pip byte-compiles package data too: installed task folders hold __pycache__ directories.
    return [relative for relative, info in walk_beneath(str(root)) if not stat.S_ISDIR(info.st_mode)
            and "__pycache__" not in relative.split("/") and not relative.endswith(".pyc")]


def task_private_paths(task: TaskSpec) -> list[str]:
    """Host paths of a task that no sandbox may see: its whole source, hidden tests and reference files.

    The one place that decides it, for agent and grading sandboxes alike: the hidden tests, the
    workspace's source (a directory, tarball or git repository: agents work on a prepared copy, and
    the source may hold ``*.orig`` files or history) and, for a task folder (``task.json`` next to
    ``repo/``), the whole folder (gold patch, notes). Sandboxes see these paths empty.
    """
    paths = [task.hidden_tests] if task.hidden_tests else []
    if task.workspace:
        location = task.workspace
        if "@" in location and not Path(location).exists():
            location = location.partition("@")[0]
        source = Path(location)
        if source.exists():
            paths.append(str(source.resolve()))
            folder = source.resolve().parent
            if (folder / "task.json").is_file():
                paths.append(str(folder))
    return sorted(set(paths))


def prepare_workspace(task: TaskSpec, destination: str | Path, *, reference_globs: Iterable[str] = ()) -> list[str]:
    """Build the agent's starting workspace for ``task`` in empty directory ``destination``.

    Returns the paths stripped. The result holds one commit, ``initial state``, of the stripped tree.
    """
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    if any(destination.iterdir()):
        raise SandboxError(f"workspace destination {destination} is not empty")
    if task.workspace:
        _copy_source(task.workspace, destination)
    if (destination / ".git").exists():
        shutil.rmtree(destination / ".git")  # a copied or unpacked history must not survive either
    removed = strip_artifacts(destination, [*reference_globs, *task.reference_globs],
                              hidden_paths=hidden_test_paths(task))
    _git(["init", "--quiet", "--initial-branch=main"], destination)
    _git(["add", "--all", "--force"], destination)
    _git(["commit", "--quiet", "--allow-empty", "--no-verify", "-m", INITIAL_COMMIT_MESSAGE], destination)
    return removed


# ------------------------------------------------------------------------------ diffs
MAX_DIFF_FILE_BYTES = 1024 * 1024
"""A file larger than this is not diffed as text (it is listed as binary, so it cannot be applied):
the host's memory and time per answer stay bounded whatever the sandbox wrote (difflib is quadratic)."""


def _entries(root: Path) -> dict[str, tuple[str, bytes]]:
    """Regular files and symlinks below ``root`` (``.git`` excluded): path -> (kind, content).

    A file over :data:`MAX_DIFF_FILE_BYTES` is represented by a marker and its SHA-256 (read in
    blocks): unchanged, it compares equal; changed, its diff is a binary one.
    """
    entries = {}
    for relative, info in walk_beneath(str(root)):
        if relative == ".git" or relative.startswith(".git/"):
            continue
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = ("link", os.readlink(root / relative).encode())
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(root / relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as handle:
                content = handle.read(MAX_DIFF_FILE_BYTES + 1)
                if len(content) > MAX_DIFF_FILE_BYTES:  # equal only to itself, and never decodable
                    digest = hashlib.sha256(content)
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                    content = _TOO_LARGE + digest.digest()
            entries[relative] = ("exec" if info.st_mode & 0o111 else "file", content)
    return entries


_TOO_LARGE = b"\xff relayrl: larger than MAX_DIFF_FILE_BYTES"


def _mode(kind: str) -> str:
    return {"file": "100644", "exec": "100755", "link": "120000"}[kind]


def _hunks(old: bytes, new: bytes, old_name: str, new_name: str) -> list[str]:
    old_lines = old.decode().splitlines(keepends=True)
    new_lines = new.decode().splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(old_lines, new_lines, old_name, new_name, n=3):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    return lines


def workspace_diff(before: str | Path, after: str | Path) -> str:
    """A ``git apply``-able diff turning tree ``before`` into tree ``after`` (``.git`` ignored).

    Binary (non-UTF-8) changes are listed as ``Binary files ... differ`` and cannot be applied:
    a code answer that needs them fails to apply, which grades as a failure.
    """
    old, new = _entries(Path(before)), _entries(Path(after))
    out: list[str] = []
    for path in sorted(set(old) | set(new)):
        previous, current = old.get(path), new.get(path)
        if previous == current:
            continue
        header = [f"diff --git a/{path} b/{path}\n"]
        if previous is None:
            header.append(f"new file mode {_mode(current[0])}\n")
        elif current is None:
            header.append(f"deleted file mode {_mode(previous[0])}\n")
        elif previous[0] != current[0]:
            header += [f"old mode {_mode(previous[0])}\n", f"new mode {_mode(current[0])}\n"]
        old_bytes = previous[1] if previous else b""
        new_bytes = current[1] if current else b""
        try:
            body = _hunks(old_bytes, new_bytes, f"a/{path}" if previous else "/dev/null",
                          f"b/{path}" if current else "/dev/null") if old_bytes != new_bytes else []
        except UnicodeDecodeError:
            body = [f"Binary files a/{path} and b/{path} differ\n"]
        out += header + body
    return "".join(out)


def apply_patch_locally(root: str | Path, patch: str) -> None:
    """``git apply`` a diff to a trusted tree on the host (gold patches in tests and verification)."""
    if not patch.strip():
        return
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), **GIT_ENV}
    result = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch, text=True,
                            capture_output=True, env=env)
    if result.returncode != 0:
        raise SandboxError(f"patch does not apply in {root}: {result.stderr.strip()}")
