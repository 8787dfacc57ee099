"""The allowlist of what a sandbox sees: system directories, exposed paths (symlinks resolved), nothing else."""

from __future__ import annotations

import os
import sys

from relayrl.sandbox.view import SYSTEM_PATHS, interpreter_paths, normalized, visible_paths, within


def test_only_existing_system_directories_and_exposed_paths_parents_first_none_nested(tmp_path):
    (tmp_path / "tools" / "bin").mkdir(parents=True)
    visible = visible_paths([tmp_path / "tools", tmp_path / "tools" / "bin", tmp_path / "absent", "/usr/lib"])
    assert str(tmp_path / "tools") in visible and str(tmp_path / "absent") not in visible
    assert str(tmp_path / "tools" / "bin") not in visible and "/usr/lib" not in visible  # inside a visible path
    assert set(visible) - {str(tmp_path / "tools")} <= set(SYSTEM_PATHS)
    assert "/usr" in visible and "/" not in visible_paths(["/"])


def test_an_exposed_symlink_brings_its_target_and_parents_are_resolved(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "dir-link").symlink_to(tmp_path)
    assert normalized(tmp_path / "link") == [str(tmp_path / "link"), str(tmp_path / "real")]
    assert normalized(tmp_path / "dir-link" / "real") == [str(tmp_path / "real")]
    assert within(str(tmp_path / "real" / "x"), [str(tmp_path / "real")])
    assert not within(str(tmp_path / "realm"), [str(tmp_path / "real")])


def test_an_interpreter_brings_its_executable_and_prefixes():
    paths = interpreter_paths(sys.executable)
    assert os.path.dirname(os.path.realpath(sys.executable)) in paths
    assert sys.prefix in paths and sys.base_prefix in paths
    assert interpreter_paths("/no/such/python") == []
