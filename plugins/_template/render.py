"""Render this template into a new plugin: ``python plugins/_template/render.py NAME DEST [--kind KIND]``.

NAME is the backend name (``mystore`` gives distribution ``relayrl-mystore``, import
``relayrl_mystore``). KIND is the extension point: ``store`` (the default, the template's own
files), or one of the folders under ``kinds/`` (``loss``, ``codec``, ``advantage``,
``correction``, ``harness``): an example implementation, its hook, and a test that subclasses that
kind's conformance suite. Every occurrence of the template's names in file contents and paths is
replaced; build artefacts and ``render.py`` itself are not copied. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent
KINDS = TEMPLATE / "kinds"
SKIP = {"render.py", "kinds", "__pycache__", ".pytest_cache", "build", "dist"}
STORE_ONLY = {"src/relayrl_template/store.py", "src/relayrl_template/plugin.py", "tests/test_plugin.py"}
"""The store kind's files, replaced by another kind's."""


def kinds() -> list[str]:
    """Every kind the template renders."""
    return ["store", *sorted(path.name for path in KINDS.iterdir() if (path / "kind.json").is_file())]


def render(name: str, destination: Path, kind: str = "store") -> Path:
    """Copy the template to ``destination`` as plugin ``relayrl-<name>`` of ``kind``; return the new folder."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*", name):
        raise SystemExit(f"render.py: plugin name {name!r} must be lowercase letters, digits, '-' or '_'")
    if kind not in kinds():
        raise SystemExit(f"render.py: unknown kind {kind!r} (available: {', '.join(kinds())})")
    module = name.replace("-", "_")
    replacements = [("relayrl-template", f"relayrl-{name}"), ("relayrl_template", f"relayrl_{module}")]
    if destination.exists() and any(destination.iterdir()):
        raise SystemExit(f"render.py: {destination} exists and is not empty")
    files: dict[str, Path] = {}  # path in the rendered plugin (before renaming) -> source
    for source in sorted(TEMPLATE.rglob("*")):
        relative = source.relative_to(TEMPLATE)
        if source.is_file() and not any(part in SKIP or part.endswith(".egg-info") for part in relative.parts):
            files[relative.as_posix()] = source
    if kind != "store":
        for path in STORE_ONLY:
            files.pop(path)
        for source in sorted((KINDS / kind).glob("*.py")):
            folder = "tests" if source.name.startswith("test_") else "src/relayrl_template"
            files[f"{folder}/{source.name}"] = source
    for relative, source in files.items():
        target = destination / _replace(relative, replacements)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = source.read_text()
        except UnicodeDecodeError:
            shutil.copy2(source, target)
            continue
        if kind != "store" and relative in ("pyproject.toml", "README.md"):
            text = _for_kind(relative, text, json.loads((KINDS / kind / "kind.json").read_text()))
        target.write_text(_replace(text, replacements))
    return destination


def _replace(text: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def _for_kind(relative: str, text: str, spec: dict[str, object]) -> str:
    """The pyproject's description and dependencies, or the README's summary, of another kind."""
    if relative == "README.md":
        title = text.splitlines()[0]
        return f"{title}\n\n{spec['description']}.\n\n    pip install -e '.[testing]'\n    relayrl plugins\n    pytest tests\n"
    text = re.sub(r'(?m)^description = ".*"$', f'description = "{spec["description"]}"', text)
    text = re.sub(r"(?m)^dependencies = \[.*\]$", f"dependencies = {json.dumps(spec['dependencies'])}", text)
    return re.sub(r"(?m)^testing = \[.*\]$", f"testing = {json.dumps(spec['testing'])}", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="backend name, e.g. mystore -> relayrl-mystore / relayrl_mystore")
    parser.add_argument("destination", nargs="?", type=Path)
    parser.add_argument("--kind", default="store", help=f"the extension point: {', '.join(kinds())}")
    parser.add_argument("--list-kinds", action="store_true", help="print the kinds, one per line, and exit")
    args = parser.parse_args()
    if args.list_kinds:
        print("\n".join(kinds()))
        return
    if args.name is None or args.destination is None:
        parser.error("NAME and DESTINATION are required")
    print(render(args.name, args.destination, args.kind))


if __name__ == "__main__":
    main()
