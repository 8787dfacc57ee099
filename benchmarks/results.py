"""Benchmark results files, and the docs blocks rendered from them.

A benchmark's full run writes ``benchmarks/results/<name>.json``: what it measured, the markdown it
renders for the docs, the command that produced it, and where (machine, commit, date). Docs quote
a results file only through a generated block::

    <!-- results: async_vs_sync-quickstart -->
    ...rendered from benchmarks/results/async_vs_sync-quickstart.json, never edited by hand...
    <!-- /results -->

``python benchmarks/results.py`` rewrites every such block from its file; ``--check`` exits 1 naming
each block that differs (the docs test runs it), so a number in the docs is always the one a
script wrote.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted(path for pattern in ("*/README.md", "packages/*/README.md", "plugins/*/README.md")
                for path in ROOT.glob(pattern))]
"""Every page a reader meets: the README, docs/, and the README of each folder, package and plugin."""
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)

__all__ = ["command_line", "commit", "machine", "render_block", "write_results"]


def machine() -> dict[str, Any]:
    """Where a benchmark ran: enough to tell two machines apart."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    memory_gib = 0.0
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    torch_version, gpu = "", ""
    try:
        import torch
        torch_version = torch.__version__
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cpu": model, "gpu": gpu, "memory_gib": round(memory_gib, 1), "python": platform.python_version(),
            "torch": torch_version, "system": platform.platform()}


def commit() -> str:
    """The repository's commit, with ``+dirty`` when the work tree differs from it.

    ``RELAYRL_COMMIT``, where set, names the commit (a copy of the tree sent to a GPU host may carry no
    git history, or a stale one), but never hides a change: where git knows that commit, the tree is
    compared with it and ``+dirty`` added if they differ; where it cannot check (no git, or a history
    without that commit) the name gets ``+unverified``. Without either the commit is ``unknown``."""
    named = os.environ.get("RELAYRL_COMMIT", "").strip()
    try:
        head = _git("rev-parse", "--short=12", named or "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return f"{named}+unverified" if named else "unknown"
    try:  # tracked files that differ from the commit (staged or not); untracked files are not results' inputs
        changed = _git("diff", "--name-only", head, "--")
    except (OSError, subprocess.CalledProcessError):
        return f"{named or head}+unverified"
    return (named or head) + ("+dirty" if changed else "")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def write_results(name: str, *, command: str, markdown: str, data: dict[str, Any],
                  folder: Path = RESULTS, revision: str | None = None) -> Path:
    """Write ``<folder>/<name>.json``: ``data`` (the numbers), ``markdown`` (what docs show) and provenance
    (``revision``: the commit the benchmark started on, from :func:`commit`; default: the current one)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    record = {"name": name, "command": command, "commit": revision or commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "machine": machine(),
              "markdown": markdown.strip() + "\n", "data": data}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def command_line(argv: Sequence[str] | None = None) -> str:
    """How the running benchmark was started, for its results file: ``python benchmarks/<script> ARGS``
    (``argv``: the arguments its ``main`` parsed; default: the process's own)."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    # Quoted as a shell would need it (an argument with spaces or a "|", such as overhead.py's --sides).
    return shlex.join(["python", str(shown), *(sys.argv[1:] if argv is None else argv)])


def render_block(name: str, folder: Path = RESULTS) -> str:
    """The body of a docs block for results file ``name``: its markdown and a line saying where it came from."""
    record = json.loads((folder / f"{name}.json").read_text())
    where = record["machine"]
    return (f"{record['markdown']}\n"
            f"*Generated from `benchmarks/results/{name}.json`: `{record['command']}` at commit "
            f"{record['commit']} on {record['date']}, {where['cpus']} CPUs ({where['cpu'] or 'unknown CPU'})"
            f"{', GPU ' + where['gpu'] if where.get('gpu') else ''}.*\n")


def stale_blocks(paths: list[Path] = DOCS, folder: Path = RESULTS, *, fix: bool = False) -> list[str]:
    """Every generated block whose body differs from its results file (rewritten when ``fix``)."""
    stale = []
    for path in paths:
        text = path.read_text()
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        pieces, last = [], 0
        for match in BLOCK.finditer(text):
            name = match["name"]
            body = match["body"]
            if not (folder / f"{name}.json").exists():
                stale.append(f"{where}: block {name!r} has no benchmarks/results/{name}.json")
            elif render_block(name, folder) != body:
                stale.append(f"{where}: block {name!r} differs from benchmarks/results/{name}.json")
                body = render_block(name, folder)
            pieces += [text[last:match.start("body")], body]
            last = match.end("body")
        updated = "".join(pieces) + text[last:]
        if fix and updated != text:
            path.write_text(updated)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the docs' generated blocks from benchmarks/results/.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    stale = stale_blocks(fix=not args.check)
    for line in stale:
        print(line)
    if args.check and stale:
        print("run `python benchmarks/results.py` to regenerate them", file=sys.stderr)
        return 1
    return 1 if any("has no" in line for line in stale) else 0  # a missing file cannot be rendered


if __name__ == "__main__":
    sys.exit(main())
