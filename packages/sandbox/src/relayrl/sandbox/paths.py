"""Host-side file access inside a workspace that untrusted code controls.

The host (often root) reads and writes workspace files for the tools and the grader. A planted
symlink (``notes -> /etc/shadow``) or a ``..`` must never make it touch anything outside, even if
the sandboxed code swaps a path component between a check and the use. So paths are opened one
component at a time, each relative to the directory descriptor of the previous one, with
``O_NOFOLLOW``: there is no check-then-use window to race.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import PurePosixPath

from relayrl.sandbox.api import SandboxError

__all__ = ["open_beneath", "read_beneath", "read_chunks_beneath", "relative_parts", "walk_beneath", "write_beneath"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def relative_parts(path: str) -> list[str]:
    """The components of a workspace-relative ``path``; absolute paths and ``..`` are refused."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise SandboxError(f"invalid workspace path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise SandboxError(f"{path}: absolute paths are outside the workspace; use a path relative to it")
    parts = [part for part in pure.parts if part != "."]
    if ".." in parts:
        raise SandboxError(f"{path}: '..' is not allowed in workspace paths")
    return parts


@contextlib.contextmanager
def _parent_fd(root: str, parts: list[str], *, create: bool, owner: tuple[int, int] | None) -> Iterator[int]:
    fd = os.open(root, _DIR_FLAGS)
    try:
        for index, part in enumerate(parts):
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:  # a concurrent write_file made it first: use theirs
                    made = False
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if owner is not None and made:
                    os.fchown(next_fd, *owner)
            except (NotADirectoryError, OSError) as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                if exc.errno in (20, 40):  # ENOTDIR, ELOOP (a symlink)
                    raise SandboxError(f"{'/'.join(parts[:index + 1])}: not a directory inside the workspace "
                                       f"(symlinks are not followed)") from None
                raise
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def open_beneath(root: str, path: str, flags: int, mode: int = 0o644, *,
                 owner: tuple[int, int] | None = None) -> int:
    """``os.open`` of ``root/path`` that never leaves ``root`` (missing parents created for writes)."""
    parts = relative_parts(path)
    create = bool(flags & os.O_CREAT)
    try:
        with _parent_fd(root, parts[:-1], create=create, owner=owner) as parent:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
    except FileNotFoundError:
        raise SandboxError(f"{path}: no such file in the workspace") from None
    except OSError as exc:
        if exc.errno == 40:
            raise SandboxError(f"{path}: is a symlink; the sandbox does not follow symlinks from the host") from None
        if exc.errno == 21:
            raise SandboxError(f"{path}: is a directory") from None
        raise SandboxError(f"{path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SandboxError(f"{path}: {'is a directory' if stat.S_ISDIR(mode) else 'not a regular file'}")
    if owner is not None and flags & os.O_CREAT:
        os.fchown(fd, *owner)
    return fd


def read_beneath(root: str, path: str, *, limit: int | None = None) -> bytes:
    """The bytes of ``root/path`` (at most ``limit``): a regular file only, never blocking on a FIFO."""
    return b"".join(read_chunks_beneath(root, path, chunk_bytes=1 << 20, limit=limit))


def read_chunks_beneath(root: str, path: str, *, chunk_bytes: int, limit: int | None = None) -> Iterator[bytes]:
    """The bytes of ``root/path`` (at most ``limit``) in chunks of at most ``chunk_bytes``, one in memory
    at a time: a regular file only, never blocking on a FIFO."""
    fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    left = limit
    with os.fdopen(fd, "rb") as handle:
        while left is None or left > 0:
            chunk = handle.read(chunk_bytes if left is None else min(chunk_bytes, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk


def write_beneath(root: str, path: str, data: bytes, *, owner: tuple[int, int] | None = None) -> None:
    """Write ``root/path``: a regular file only. O_NONBLOCK: opening a FIFO the sandbox planted fails
    at once (or is refused as not regular) instead of blocking the host until something reads it."""
    fd = open_beneath(root, path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, owner=owner)
    os.ftruncate(fd, 0)  # after the regular-file check in open_beneath, never on a FIFO or device
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def walk_beneath(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``root`` as ``(relative path, lstat)``, never following symlinks, sorted."""
    stack = [""]
    while stack:
        relative = stack.pop()
        directory = os.path.join(root, relative) if relative else root
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            path = f"{relative}/{entry.name}" if relative else entry.name
            info = entry.stat(follow_symlinks=False)
            yield path, info
            if stat.S_ISDIR(info.st_mode):
                stack.append(path)
