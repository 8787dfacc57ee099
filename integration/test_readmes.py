"""Component READMEs work as written: each says how to install it from a clone, and its Python
snippets run (in a fresh interpreter, in an empty directory, with every package installed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = sorted(path for pattern in ("packages/*/README.md", "plugins/*/README.md") for path in ROOT.glob(pattern))
SNIPPETS = [(readme, index, code) for readme in READMES
            for index, code in enumerate(re.findall(r"```python\n(.*?)```", readme.read_text(), re.S))]


@pytest.mark.parametrize("readme", READMES, ids=lambda path: str(path.parent.relative_to(ROOT)))
def test_every_component_readme_says_how_to_install_it_from_a_clone(readme):
    folder = f"./{readme.parent.relative_to(ROOT)}"
    lines = [line for line in readme.read_text().splitlines() if "pip install" in line and folder in line]
    assert lines, f"{readme.relative_to(ROOT)}: no `pip install ... {folder}` line"


@pytest.mark.parametrize(("readme", "index", "code"), SNIPPETS,
                         ids=[f"{readme.parent.name}-{index}" for readme, index, _ in SNIPPETS])
def test_readme_python_snippets_run_as_written(readme, index, code, tmp_path):
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{readme.relative_to(ROOT)} snippet {index}:\n{code}\n{result.stderr[-3000:]}"


def test_benchmarks_readme_lists_every_benchmark_script():
    """Every script with a command line under benchmarks/ is named in its README's table (helpers need not be)."""
    folder = ROOT / "benchmarks"
    listed = set(re.findall(r"`([\w/.-]+\.py)`", (folder / "README.md").read_text()))
    scripts = {str(path.relative_to(folder)) for path in folder.rglob("*.py")
               if 'if __name__ == "__main__"' in path.read_text() and path.name != "results.py"}
    assert not scripts - listed, f"benchmarks/README.md has no row for {sorted(scripts - listed)}"
