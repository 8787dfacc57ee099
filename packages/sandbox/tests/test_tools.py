"""The agent's tools: each tool, malformed calls, and concurrent turns with results in call order."""

from __future__ import annotations

import shutil

import pytest

from relayrl.core.wire import ToolCall
from relayrl.sandbox.testing import call
from relayrl.sandbox.tools import TOOL_SCHEMAS, ToolBox


@pytest.fixture
def toolbox(backend, tmp_path):
    (tmp_path / "ws" / "pkg").mkdir(parents=True)
    (tmp_path / "ws" / "pkg" / "mod.py").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    (tmp_path / "ws" / "notes.md").write_text("needle here\n")
    with backend.create(tmp_path / "ws") as sandbox:
        yield ToolBox(sandbox, timeout_s=20)


def run(toolbox, name, **arguments):
    return toolbox.run(call(name, **arguments))


def test_bash_and_python(toolbox):
    result = run(toolbox, "bash", command="echo hi; exit 4")
    assert result.output == "hi\n" and result.exit_status == 4 and result.error is None and result.wall_time_s > 0
    assert run(toolbox, "python", code="print(sum(range(5)))").output == "10\n"


def test_read_file_with_line_ranges(toolbox):
    assert run(toolbox, "read_file", path="pkg/mod.py", start_line=3, end_line=4).output == "3\tline 3\n4\tline 4\n"
    assert run(toolbox, "read_file", path="pkg/mod.py").output.count("\n") == 10
    assert run(toolbox, "read_file", path="pkg/mod.py", start_line=5, end_line=2).error


def test_write_edit_and_their_errors(toolbox):
    assert run(toolbox, "write_file", path="new/a.py", content="x = 1\nx = 1\n").error is None
    ambiguous = run(toolbox, "edit", path="new/a.py", old="x = 1", new="x = 2")
    assert ambiguous.error and "2 times" in ambiguous.error
    assert run(toolbox, "edit", path="new/a.py", old="x = 1", new="x = 2", count=2).error is None
    assert run(toolbox, "read_file", path="new/a.py").output == "1\tx = 2\n2\tx = 2\n"
    assert "not found" in run(toolbox, "edit", path="new/a.py", old="absent", new="").error
    assert run(toolbox, "write_file", path="../escape.py", content="").error


def test_list(toolbox):
    listing = run(toolbox, "list").output
    assert "f pkg/mod.py" in listing and "d pkg" in listing and ".git" not in listing


@pytest.mark.parametrize("ripgrep", [True, False], ids=["ripgrep", "grep"])
def test_grep(toolbox, ripgrep):
    if ripgrep and shutil.which("rg") is None:
        pytest.skip("ripgrep is not installed on this host (apt-get install -y ripgrep)")
    toolbox.ripgrep = ripgrep
    assert "notes.md:1:needle here" in run(toolbox, "grep", pattern="needle").output
    assert run(toolbox, "grep", pattern="no-such-text").output == "(no matches)\n"
    assert "mod.py" in run(toolbox, "grep", pattern="line 7", glob="*.py").output


def test_malformed_calls_become_error_results(toolbox):
    assert "unknown tool" in run(toolbox, "teleport").error
    assert "bad arguments" in toolbox.run(ToolCall(id="x", name="bash", arguments={"cmd": "ls"})).error


def test_turn_runs_calls_concurrently_and_returns_them_in_call_order(toolbox):
    # Every call waits until all eight have started: the turn can only finish if they run at once.
    wait_for_all = ("touch started-{i}; for _ in $(seq 200); do [ $(ls started-* | wc -l) -ge 8 ] && break; "
                    "sleep 0.05; done; ls started-* | wc -l")
    calls = [call("bash", command=wait_for_all.format(i=i)) for i in range(8)]
    results = toolbox.run_turn(calls)
    assert [result.call_id for result in results] == [c.id for c in calls]
    assert [result.output.strip() for result in results] == ["8"] * 8


def test_parallelism_is_bounded(toolbox):
    toolbox.max_parallel = 2
    # With two slots, no call can ever see more than two started siblings running at once.
    count_running = ("mkdir -p run; touch run/{i}; n=$(ls run | wc -l); sleep 0.2; rm run/{i}; echo $n")
    results = toolbox.run_turn([call("bash", command=count_running.format(i=i)) for i in range(6)])
    assert max(int(result.output) for result in results) <= 2


def test_schemas_cover_every_tool(toolbox):
    assert sorted(schema["function"]["name"] for schema in TOOL_SCHEMAS) == sorted(toolbox.tools)


def test_configured_from_the_section(toolbox):
    from relayrl.sandbox.config import SandboxSection

    configured = ToolBox.from_section(toolbox.sandbox, SandboxSection(max_parallel_tools=3, tool_timeout_s=5))
    assert (configured.max_parallel, configured.timeout_s) == (3, 5)


def test_async_execute_for_the_rollout_agent_loop(toolbox):
    import asyncio

    calls = [call("bash", command=f"echo {index}") for index in range(3)]
    results = asyncio.run(toolbox.execute(calls))
    assert [result.output for result in results] == ["0\n", "1\n", "2\n"]
    assert "bash" in toolbox.tool_names and list(toolbox.tool_names) == sorted(toolbox.tool_names)


def test_the_tools_treat_the_sandboxs_files_as_hostile(toolbox):
    """A FIFO blocks no tool; a huge file costs the host a bounded read; parallel writes share a new directory."""
    run(toolbox, "bash", command="mkfifo trap; head -c 50000000 /dev/zero | tr '\\0' 'x' > huge.txt; echo >> huge.txt")
    for name, arguments in (("write_file", {"path": "trap", "content": "x"}), ("read_file", {"path": "trap"}),
                            ("edit", {"path": "trap", "old": "a", "new": "b"})):
        result = run(toolbox, name, **arguments)
        assert result.error and ("regular file" in result.error or "No such device" in result.error), result
    huge = run(toolbox, "read_file", path="huge.txt", start_line=2)
    assert huge.error and "larger than" in huge.error
    assert "larger than" in run(toolbox, "edit", path="huge.txt", old="x", new="y", count=1).error
    results = toolbox.run_turn([call("write_file", path=f"fresh/dir/file{index}.txt", content=str(index))
                                for index in range(8)])
    assert [result.error for result in results] == [None] * 8
    assert run(toolbox, "bash", command="cat fresh/dir/file*.txt").output == "01234567"


@pytest.mark.parametrize("content", [b"\n" * (4 << 20), b"ab\n" * (1 << 20), b"x" * (4 << 20)],
                         ids=["4 MiB of newlines", "a million short lines", "one 4 MiB line"])
def test_read_file_costs_the_host_what_it_returns_not_what_the_file_holds(toolbox, content):
    """The line tools stream: the host's peak is a few times the output cap, whatever the file's shape."""
    import tracemalloc

    toolbox.sandbox.write_file("planted.txt", content)
    tracemalloc.start()
    try:
        result = run(toolbox, "read_file", path="planted.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.error is None and result.truncated and len(result.output.encode()) < 2 * toolbox.max_output_bytes
    # Before streaming, a file of newlines cost the host many times its size.
    assert peak < 32 * toolbox.max_output_bytes, f"peak {peak / 2**20:.1f} MiB"


def test_read_file_numbers_lines_as_sed_does_and_says_where_to_continue(toolbox):
    toolbox.sandbox.write_file("crlf.txt", b"one\r\ntwo\x0cstill two\r\nthree")
    assert run(toolbox, "read_file", path="crlf.txt").output == "1\tone\n2\ttwo\x0cstill two\n3\tthree\n"
    assert run(toolbox, "read_file", path="crlf.txt", start_line=9).output == "(crlf.txt has 3 lines)\n"
    toolbox.sandbox.write_file("long.txt", "".join(f"{n:09d}\n" for n in range(20_000)))
    first = run(toolbox, "read_file", path="long.txt")
    assert first.truncated and "continue with start_line=" in first.output
    resume = int(first.output.rsplit("start_line=", 1)[1].split("]")[0])
    second = run(toolbox, "read_file", path="long.txt", start_line=resume, end_line=resume)
    assert second.output == f"{resume}\t{resume - 1:09d}\n"
