"""Installable-looking plugin distributions made on the fly, for testing plugin loading.

:func:`write_distribution` writes a module and a ``*.dist-info`` directory with an
``entry_points.txt`` into a folder; with that folder on ``sys.path`` (or ``PYTHONPATH`` for a
subprocess), ``importlib.metadata`` finds it exactly as it finds a pip-installed plugin.
"""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path


def write_distribution(folder: Path, *, distribution: str, module: str, source: str,
                       entry_points: dict[str, str] | None = None, version: str = "0.1.0") -> Path:
    """Write module ``module`` with ``source`` and a dist-info advertising ``entry_points``.

    ``entry_points`` maps entry-point name to ``module[:attr]`` in group ``relayrl``; by default
    one entry point named ``distribution`` pointing at ``module``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    normalized = distribution.replace("-", "_")
    info = folder / f"{normalized}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    entries = entry_points if entry_points is not None else {distribution: module}
    lines = ["[relayrl]"] + [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    importlib.invalidate_caches()
    return folder
