"""The agent's answer: a git-style diff of the pristine tree and the final workspace, made on the host.

No git runs in the agent's tree: a planted ``.git/config`` (``core.fsmonitor``, hooks, aliases) must
never execute on the host, and a forged history must not hide edits.

The workspace is the sandbox's, hence hostile, and the diff is made in the host's memory, so every
cost is bounded by what the diff returns plus small constants, never by the size or line count of
what the sandbox wrote:

* the trees are compared by digests (files read in blocks); only changed files are read whole, one
  at a time, and only up to :data:`MAX_DIFF_FILE_BYTES` (a larger one is a binary change);
* of a changed file, only the lines between the common head and tail are diffed line by line
  (difflib, at most :data:`MAX_DIFFED_LINES`); past that, the region becomes one replacement hunk,
  built as whole strings, not one object per line;
* a diff past :data:`MAX_DIFF_BYTES`, or a tree past :data:`MAX_DIFF_ENTRIES` entries, is refused:
  the answer becomes :data:`TOO_LARGE_ANSWER`, which does not apply, so it grades as a failure.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from pathlib import Path

from relayrl.sandbox.api import SandboxError
from relayrl.sandbox.paths import open_beneath, walk_beneath

__all__ = [
    "MAX_DIFFED_LINES",
    "MAX_DIFF_BYTES",
    "MAX_DIFF_ENTRIES",
    "MAX_DIFF_FILE_BYTES",
    "TOO_LARGE_ANSWER",
    "workspace_diff",
]

MAX_DIFF_FILE_BYTES = 1024 * 1024
"""A file larger than this is not diffed as text (it is listed as binary, so it cannot be applied)."""
MAX_DIFF_BYTES = 8 * 1024 * 1024
"""The largest answer: a code change past this many bytes of diff is not graded."""
MAX_DIFF_ENTRIES = 200_000
"""The most files, links and directories a workspace may hold for its diff to be made."""
MAX_DIFFED_LINES = 20_000
"""The most lines of a changed region diffed line by line; a larger region is replaced whole."""
TOO_LARGE_ANSWER = "relayrl: the answer is too large to grade (see relayrl.sandbox.diffs)\n"
"""The answer when the diff is refused: not a patch, so ``git apply`` fails and the grade is 0."""

_CONTEXT = 3


class _TooLarge(Exception):
    pass


def workspace_diff(before: str | Path, after: str | Path) -> str:
    """A ``git apply``-able diff turning tree ``before`` into tree ``after`` (``.git`` ignored).

    Binary (non-UTF-8) and oversized changes are listed as ``Binary files ... differ`` and cannot be
    applied: a code answer that needs them fails to apply, which grades as a failure. See the module
    docstring for the bounds.
    """
    try:
        old, new = _entries(Path(before)), _entries(Path(after))
        out = _Output()
        for path in sorted(set(old) | set(new)):
            previous, current = old.get(path), new.get(path)
            if previous == current:
                continue
            out.add(f"diff --git a/{path} b/{path}\n")
            if previous is None:
                out.add(f"new file mode {_MODES[current[0]]}\n")  # type: ignore[index]
            elif current is None:
                out.add(f"deleted file mode {_MODES[previous[0]]}\n")
            elif previous[0] != current[0]:
                out.add(f"old mode {_MODES[previous[0]]}\nnew mode {_MODES[current[0]]}\n")
            if previous is not None and current is not None and previous[1:] == current[1:]:
                continue  # the mode alone changed
            old_text = _text(Path(before), path, previous)
            new_text = _text(Path(after), path, current)
            if old_text is None or new_text is None:
                out.add(f"Binary files a/{path} and b/{path} differ\n")
                continue
            _hunks(out, old_text, new_text, f"a/{path}" if previous else "/dev/null",
                   f"b/{path}" if current else "/dev/null")
        return out.text()
    except _TooLarge:
        return TOO_LARGE_ANSWER


_MODES = {"file": "100644", "exec": "100755", "link": "120000"}


class _Output:
    """The diff's pieces, refusing to grow past :data:`MAX_DIFF_BYTES`."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.size = 0

    def add(self, piece: str) -> None:
        self.size += len(piece)
        if self.size > MAX_DIFF_BYTES:
            raise _TooLarge
        self.pieces.append(piece)

    def text(self) -> str:
        return "".join(self.pieces)


def _entries(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Regular files and symlinks below ``root`` (``.git`` excluded): path -> (kind, size, digest).

    A file's digest is its SHA-256, read in blocks; a link's is its target. Nothing else is kept:
    the host holds a few dozen bytes per entry, whatever the files hold.
    """
    entries = {}
    for count, (relative, info) in enumerate(walk_beneath(str(root))):
        if count >= MAX_DIFF_ENTRIES:
            raise _TooLarge
        if relative == ".git" or relative.startswith(".git/"):
            continue
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(root / relative).encode(errors="surrogateescape")
            entries[relative] = ("link", len(target), target)
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = open_beneath(str(root), relative, os.O_RDONLY | os.O_NONBLOCK)
            except SandboxError:
                continue  # replaced by a link or a FIFO since the walk: not a regular file
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
            entries[relative] = ("exec" if info.st_mode & 0o111 else "file", size, digest.digest())
    return entries


def _text(root: Path, path: str, entry: tuple[str, int, bytes] | None) -> str | None:
    """The content of one side of a change as text ("" when absent); None if binary or oversized."""
    if entry is None:
        return ""
    kind, size, digest = entry
    if kind == "link":
        return digest.decode(errors="surrogateescape")
    if size > MAX_DIFF_FILE_BYTES:
        return None
    try:
        fd = open_beneath(str(root), path, os.O_RDONLY | os.O_NONBLOCK)
    except SandboxError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_DIFF_FILE_BYTES + 1)
    if len(data) > MAX_DIFF_FILE_BYTES:
        return None  # grew since the walk
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _hunks(out: _Output, old: str, new: str, old_name: str, new_name: str) -> None:
    """The unified-diff hunks of ``old`` -> ``new`` (3 lines of context), into ``out``."""
    if old == new:
        return
    head = _common_head(old, new)
    tail = _common_tail(old[head:], new[head:])
    # The common head and tail as whole lines: the changed region starts and ends on line boundaries.
    start_line = old.count("\n", 0, head)
    old_middle, new_middle = old[head:len(old) - tail], new[head:len(new) - tail]
    before = _last_lines(old[:head], _CONTEXT)
    after = _first_lines(old[len(old) - tail:], _CONTEXT)
    out.add(f"--- {old_name}\n+++ {new_name}\n")
    old_count, new_count = _line_count(old_middle), _line_count(new_middle)
    if old_count + new_count > MAX_DIFFED_LINES:
        _replacement_hunk(out, start_line, before, old_middle, new_middle, after)
        return
    old_lines = [*before, *old_middle.splitlines(keepends=True), *after]
    new_lines = [*before, *new_middle.splitlines(keepends=True), *after]
    offset = start_line - len(before)  # line number (0-based) of the first line given to difflib
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines)  # autojunk, as difflib.unified_diff
    for group in matcher.get_grouped_opcodes(_CONTEXT):
        first, last = group[0], group[-1]
        out.add(f"@@ -{_range(offset + first[1], offset + last[2])} +{_range(offset + first[3], offset + last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                _lines(out, " ", old_lines[i1:i2])
                continue
            _lines(out, "-", old_lines[i1:i2])
            _lines(out, "+", new_lines[j1:j2])


def _replacement_hunk(out: _Output, start_line: int, before: list[str], old_middle: str, new_middle: str,
                      after: list[str]) -> None:
    """One hunk replacing the whole changed region; each block is prefixed as one string."""
    first = start_line - len(before)
    old_span = len(before) + _line_count(old_middle) + len(after)
    new_span = len(before) + _line_count(new_middle) + len(after)
    out.add(f"@@ -{_range(first, first + old_span)} +{_range(first, first + new_span)} @@\n")
    _lines(out, " ", before)
    _block(out, "-", old_middle)
    _block(out, "+", new_middle)
    _lines(out, " ", after)


def _lines(out: _Output, sign: str, lines: list[str]) -> None:
    for line in lines:
        out.add(sign + line if line.endswith("\n") else f"{sign}{line}\n\\ No newline at end of file\n")


def _block(out: _Output, sign: str, text: str) -> None:
    """``text``'s lines, each prefixed by ``sign``: one string as large as the output, no list of lines."""
    if not text:
        return
    if len(text) + _line_count(text) + out.size > MAX_DIFF_BYTES:
        raise _TooLarge
    body = sign + text.replace("\n", "\n" + sign)
    out.add(body[:-1] if text.endswith("\n") else body + "\n\\ No newline at end of file\n")


def _common_head(a: str, b: str) -> int:
    """The length of the longest common prefix that ends at a line boundary (after a newline)."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # binary search on slice equality: memcmp speed, no per-character Python loop
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return a.rfind("\n", 0, low) + 1


def _common_tail(a: str, b: str) -> int:
    """The length of the longest common suffix that starts at a line boundary in both (or 0)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle:] == b[len(b) - middle:]:
            low = middle
        else:
            high = middle - 1
    if low in (len(a), len(b)):  # one side is wholly a suffix of the other
        longer = b if low == len(a) else a
        if low == len(longer) or longer[len(longer) - low - 1] == "\n":
            return low
    # Otherwise the characters before the suffix differ, so neither is a newline in both: the tail
    # starts after the suffix's first newline.
    newline = a.find("\n", len(a) - low)
    return len(a) - newline - 1 if newline >= 0 else 0


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _last_lines(text: str, count: int) -> list[str]:
    """The last ``count`` lines of ``text`` (which ends at a line boundary), with their newlines."""
    start = len(text)
    for _ in range(count):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:].splitlines(keepends=True)


def _first_lines(text: str, count: int) -> list[str]:
    """The first ``count`` lines of ``text``, with their newlines."""
    end = 0
    for _ in range(count):
        if end >= len(text):
            break
        newline = text.find("\n", end)
        end = len(text) if newline < 0 else newline + 1
    return text[:end].splitlines(keepends=True)


def _range(start: int, stop: int) -> str:
    """A unified-diff range of 0-based lines ``start..stop`` (as difflib and git write it)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"
