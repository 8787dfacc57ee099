"""The agent's tools, run against one sandbox; the calls of a turn run concurrently.

Tools: ``bash``, ``read_file`` (line ranges), ``write_file``, ``edit`` (exact string replacement),
``list``, ``grep`` (ripgrep when installed, else grep) and ``python``. :meth:`ToolBox.run_turn`
runs up to ``max_parallel`` calls at once, times each, and returns the results in call order; a
malformed call becomes a :class:`ToolResult` with ``error`` set, never an exception, so one bad call
cannot lose the turn.

    toolbox = ToolBox(sandbox)
    results = toolbox.run_turn([ToolCall(id="1", name="bash", arguments={"command": "ls"}),
                                ToolCall(id="2", name="read_file", arguments={"path": "setup.py"})])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from relayrl.core.wire import ToolCall, ToolResult
from relayrl.sandbox.api import TRUNCATION_MARKER, Sandbox, SandboxError
from relayrl.sandbox.local import BASE_ENV

__all__ = ["TOOL_SCHEMAS", "ToolBox", "ToolError"]


class ToolError(Exception):
    """A call the agent got wrong (bad arguments, no match for an edit); shown to the model."""


def _schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOL_SCHEMAS: list[dict[str, Any]] = [
    _schema("bash", "Run a bash command in the repository (no network).",
            {"command": {"type": "string"}, "timeout": {"type": "number"}}, ["command"]),
    _schema("read_file", "Read a file, optionally lines start_line..end_line (1-based, inclusive).",
            {"path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, ["path"]),
    _schema("write_file", "Create or overwrite a file.", {"path": {"type": "string"}, "content": {"type": "string"}},
            ["path", "content"]),
    _schema("edit", "Replace the exact text old with new in a file; old must occur exactly once unless count is given.",
            {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"},
             "count": {"type": "integer"}}, ["path", "old", "new"]),
    _schema("list", "List files below a directory.", {"path": {"type": "string"}, "depth": {"type": "integer"}}, []),
    _schema("grep", "Search file contents with a regular expression.",
            {"pattern": {"type": "string"}, "path": {"type": "string"}, "glob": {"type": "string"}}, ["pattern"]),
    _schema("python", "Run a Python 3 program (given as source) in the repository.",
            {"code": {"type": "string"}, "timeout": {"type": "number"}}, ["code"]),
]
"""JSON schemas of the tools, in the OpenAI function-calling format the chat templates expect."""


class ToolBox:
    """The tools bound to one sandbox."""

    def __init__(self, sandbox: Sandbox, *, max_parallel: int = 8, timeout_s: float = 30.0,
                 max_output_bytes: int = 64 * 1024, python: str = "python3",
                 answer: Callable[[], str] | None = None) -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be >= 1")
        self.sandbox = sandbox
        self.answer = answer
        """Computes the episode's answer from the sandbox (:meth:`final_answer`); None: the answer is
        the trajectory's text."""
        self.max_parallel = max_parallel
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.python = python
        # Sandboxes see the host's system directories (read-only) and search the same PATH.
        self.ripgrep = shutil.which("rg", path=BASE_ENV["PATH"]) is not None
        self.tools: dict[str, Callable[..., tuple[str, int, bool]]] = {
            "bash": self.bash, "read_file": self.read_file, "write_file": self.write_file, "edit": self.edit,
            "list": self.list, "grep": self.grep, "python": self.python_tool,
        }

    @classmethod
    def from_section(cls, sandbox: Sandbox, section: Any, *, answer: Callable[[], str] | None = None) -> ToolBox:
        """Tools configured by a ``[sandbox]`` section (parallelism, timeout, output cap)."""
        return cls(sandbox, max_parallel=section.max_parallel_tools, timeout_s=section.tool_timeout_s,
                   max_output_bytes=section.limits.max_output_bytes, answer=answer)

    # ------------------------------------------------------------------------------ turn
    @property
    def tool_names(self) -> Sequence[str]:
        """The tools' names (with :meth:`execute` and :meth:`final_answer`, this is relayrl-rollout's
        ``ToolExecutor`` protocol)."""
        return sorted(self.tools)

    def final_answer(self) -> str:
        """The episode's answer for the grader: ``answer()`` when one was given, else ""."""
        return self.answer() if self.answer is not None else ""

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """:meth:`run_turn` for asyncio callers (the rollout agent loop), off the event loop."""
        return await asyncio.to_thread(self.run_turn, calls)

    def run_turn(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run the calls concurrently (at most ``max_parallel`` at once); results in call order."""
        if len(calls) <= 1:
            return [self.run(call) for call in calls]
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.max_parallel, len(calls)),
                                                   thread_name_prefix="relayrl-tool") as pool:
            return list(pool.map(self.run, calls))

    def run(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises for the agent's mistakes or the sandbox's refusals."""
        start = time.monotonic()
        tool = self.tools.get(call.name)
        try:
            if tool is None:
                raise ToolError(f"unknown tool {call.name!r} (available: {', '.join(sorted(self.tools))})")
            output, status, truncated = tool(**call.arguments)
            return ToolResult(call_id=call.id, output=output, exit_status=status,
                              wall_time_s=time.monotonic() - start, truncated=truncated)
        except TypeError as exc:
            error = f"bad arguments for {call.name}: {exc}"
        except (ToolError, SandboxError) as exc:
            error = str(exc)
        return ToolResult(call_id=call.id, output=error, exit_status=1, wall_time_s=time.monotonic() - start,
                          error=error)

    # ------------------------------------------------------------------------------ tools
    def _timeout(self, timeout: float | None) -> float:
        return self.timeout_s if timeout is None else min(float(timeout), self.timeout_s)

    def _cut(self, text: str) -> tuple[str, bool]:
        data = text.encode()
        if len(data) <= self.max_output_bytes:
            return text, False
        kept = data[:self.max_output_bytes].decode(errors="ignore")
        return kept + TRUNCATION_MARKER.format(dropped=len(data) - len(kept.encode())), True

    def bash(self, command: str, timeout: float | None = None) -> tuple[str, int, bool]:
        """Run ``command`` with ``bash -c`` in the workspace; output is stdout then stderr."""
        if not isinstance(command, str):
            raise ToolError("bash: command must be a string")
        result = self.sandbox.exec(command, timeout=self._timeout(timeout))
        return result.output, result.exit_status, result.truncated

    @property
    def max_file_bytes(self) -> int:
        """The most a file tool reads of one file: the host's memory per call stays bounded, whatever
        the sandbox planted (a file of the sandbox's size limit would otherwise be read whole)."""
        return 64 * self.max_output_bytes

    def _read(self, path: str) -> tuple[bytes, bool]:
        data = self.sandbox.read_file(path, limit=self.max_file_bytes + 1)
        return data[:self.max_file_bytes], len(data) > self.max_file_bytes

    def _lines(self, path: str, cut: list[bool]) -> Iterator[tuple[int, bytes]]:
        """``(number, line)`` for each line of ``path`` (split at ``\\n`` only, as ``sed -n`` numbers
        them; each cut to ``max_output_bytes``), streamed: the host holds one chunk and one line at a
        time, whatever the file is. Past ``max_file_bytes`` it stops (the last, possibly partial,
        line is not yielded) and appends True to ``cut``."""
        cap, seen, number, partial = self.max_output_bytes, 0, 1, b""
        for chunk in self.sandbox.read_chunks(path, chunk_bytes=1 << 16, limit=self.max_file_bytes + 1):
            seen += len(chunk)
            parts = chunk.split(b"\n")
            for part in parts[:-1]:
                yield number, (partial + part)[:cap] if partial else part[:cap]
                number, partial = number + 1, b""
            partial = (partial + parts[-1])[:cap]
            if seen > self.max_file_bytes:
                cut.append(True)
                return
        if partial:
            yield number, partial

    def read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> tuple[str, int, bool]:
        """Lines ``start_line..end_line`` (1-based, inclusive) of ``path``, each prefixed with its number.

        Streamed: the host's memory is bounded by what the call returns (a few times
        ``max_output_bytes``), not by the file's size or line count.
        """
        if start_line < 1 or (end_line is not None and end_line < start_line):
            raise ToolError(f"read_file {path}: invalid line range {start_line}..{end_line}")
        selected: list[str] = []
        budget, lines, cut, more = self.max_output_bytes, 0, [], False
        for lines, line in self._lines(path, cut):
            if lines < start_line:
                continue  # before the range (or counting the lines for the message below)
            if end_line is not None and lines > end_line:
                break
            if budget < 0:
                more = True  # past what the output cap lets through
                break
            selected.append(line.decode(errors="replace").removesuffix("\r"))
            budget -= len(selected[-1]) + 8
        if not selected:
            if cut and start_line > lines:
                raise ToolError(f"read_file {path}: the file is larger than {self.max_file_bytes} bytes and line "
                                f"{start_line} lies beyond them; use bash (sed -n) for it")
            return f"({path} has {lines} lines)\n", 0, False
        width = len(str(start_line + len(selected)))
        text = "".join(f"{number:>{width}}\t{line}\n" for number, line in enumerate(selected, start_line))
        text, truncated = self._cut(text)
        if more and not truncated:
            text += f"[read_file: the output cap stops here; continue with start_line={start_line + len(selected)}]\n"
        return text, 0, truncated or more

    def write_file(self, path: str, content: str) -> tuple[str, int, bool]:
        """Create or overwrite ``path`` (parents created)."""
        self.sandbox.write_file(path, content)
        return f"wrote {len(content.encode())} bytes to {path}\n", 0, False

    def edit(self, path: str, old: str, new: str, count: int | None = None) -> tuple[str, int, bool]:
        """Replace ``old`` by ``new``; ``old`` must occur exactly once, or exactly ``count`` times."""
        if not old:
            raise ToolError("edit: old must not be empty")
        data, cut = self._read(path)
        if cut:
            raise ToolError(f"edit {path}: the file is larger than {self.max_file_bytes} bytes; edit it with bash")
        text = data.decode()
        found = text.count(old)
        if found == 0:
            raise ToolError(f"edit {path}: old text not found")
        if count is None and found > 1:
            raise ToolError(f"edit {path}: old text occurs {found} times; add context or pass count")
        if count is not None and count != found:
            raise ToolError(f"edit {path}: old text occurs {found} times, not {count}")
        self.sandbox.write_file(path, text.replace(old, new))
        return f"replaced {found} occurrence(s) in {path}\n", 0, False

    def list(self, path: str = ".", depth: int = 2) -> tuple[str, int, bool]:
        """Entries below ``path`` to ``depth`` levels, ``d``/``f``/``l`` then the path, ``.git`` excluded."""
        command = (f"find {shlex.quote(path)} -mindepth 1 -maxdepth {int(depth)} -not -path '*/.git' "
                   f"-not -path '*/.git/*' -printf '%y %P\\n' | sort -k2")
        result = self.sandbox.exec(command, timeout=self.timeout_s)
        return result.output, result.exit_status, result.truncated

    def grep(self, pattern: str, path: str = ".", glob: str | None = None) -> tuple[str, int, bool]:
        """``path:line:text`` of every match of regular expression ``pattern`` (ripgrep when installed).

        Files come in path order: the same repository gives the same output (ripgrep's parallel
        walk would order them by chance, and the tokens a model sees with them).
        """
        if self.ripgrep:
            argv = ["rg", "--line-number", "--no-heading", "--color=never", "--sort=path", "--glob", "!.git",
                    "-e", pattern]
            argv += ["--glob", glob] if glob else []
        else:
            argv = ["grep", "-rnI", "--exclude-dir=.git", "-e", pattern]
            argv += [f"--include={glob}"] if glob else []
        result = self.sandbox.exec([*argv, "--", path], timeout=self.timeout_s)
        output = result.output if result.exit_status != 1 else "(no matches)\n"
        return output, 0 if result.exit_status == 1 else result.exit_status, result.truncated

    def python_tool(self, code: str, timeout: float | None = None) -> tuple[str, int, bool]:
        """Run Python source ``code`` (fed on stdin to ``python3 -``) in the workspace."""
        result = self.sandbox.exec([self.python, "-"], stdin=code, timeout=self._timeout(timeout))
        return result.output, result.exit_status, result.truncated
