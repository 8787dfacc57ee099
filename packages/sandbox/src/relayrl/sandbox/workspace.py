"""Workspace preparation (what the agent starts from) and diffs (what the agent hands in).

:func:`prepare_workspace` copies a task's workspace (a directory, a tarball, or a git repository,
optionally ``path@revision``), deletes reference artifacts matching the globs and anything at the
paths of the hidden tests, then replaces the git history with a single commit of that state: the
agent can ``git diff`` its own work, and no earlier commit (the fix, the tests) can leak.

:func:`workspace_diff` (from :mod:`relayrl.sandbox.diffs`) computes the agent's answer as a git-style
diff of the pristine tree and the final workspace, on the host, without running git in the agent's tree.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

from relayrl.core.wire import TaskSpec
from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.diffs import workspace_diff
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
    ``repo/``), the whole folder (gold patch, notes), and when that folder sits in a task set (a sibling
    folder holds a ``task.json`` too) the whole set: the other tasks' gold patches and hidden tests are
    secrets as well (the shipped tasks live world-readable in site-packages). Sandboxes see these paths
    empty.
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
                if folder.parent != folder.parent.parent and _holds_another_task(folder.parent, folder):
                    paths.append(str(folder.parent))
    return sorted(set(paths))


def _holds_another_task(task_set: Path, task_folder: Path) -> bool:
    """Whether ``task_set`` holds a task folder besides ``task_folder``."""
    try:
        return any(sibling != task_folder and (sibling / "task.json").is_file() for sibling in task_set.iterdir())
    except OSError:
        return False


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


def apply_patch_locally(root: str | Path, patch: str) -> None:
    """``git apply`` a diff to a trusted tree on the host (gold patches in tests and verification)."""
    if not patch.strip():
        return
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), **GIT_ENV}
    result = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch, text=True,
                            capture_output=True, env=env)
    if result.returncode != 0:
        raise SandboxError(f"patch does not apply in {root}: {result.stderr.strip()}")
