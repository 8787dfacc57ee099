"""Render this template into a new plugin: ``python plugins/_template/render.py NAME DEST``.

NAME is the backend name (``mystore`` gives distribution ``relayrl-mystore``, import
``relayrl_mystore``). Every occurrence of the template's names in file contents and paths is
replaced; build artefacts and ``render.py`` itself are not copied. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent
SKIP = {"render.py", "__pycache__", ".pytest_cache", "build", "dist"}


def render(name: str, destination: Path) -> Path:
    """Copy the template to ``destination`` as plugin ``relayrl-<name>``; return the new folder."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*", name):
        raise SystemExit(f"render.py: plugin name {name!r} must be lowercase letters, digits, '-' or '_'")
    module = name.replace("-", "_")
    replacements = [("relayrl-template", f"relayrl-{name}"), ("relayrl_template", f"relayrl_{module}")]
    if destination.exists() and any(destination.iterdir()):
        raise SystemExit(f"render.py: {destination} exists and is not empty")
    for source in sorted(TEMPLATE.rglob("*")):
        relative = source.relative_to(TEMPLATE)
        if any(part in SKIP or part.endswith(".egg-info") for part in relative.parts):
            continue
        target_relative = str(relative)
        for old, new in replacements:
            target_relative = target_relative.replace(old, new)
        target = destination / target_relative
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = source.read_text()
        except UnicodeDecodeError:
            shutil.copy2(source, target)
            continue
        for old, new in replacements:
            text = text.replace(old, new)
        target.write_text(text)
    return destination


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="backend name, e.g. mystore -> relayrl-mystore / relayrl_mystore")
    parser.add_argument("destination", type=Path)
    args = parser.parse_args()
    print(render(args.name, args.destination))


if __name__ == "__main__":
    main()
