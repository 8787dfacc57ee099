"""Docs stay true: every hookspec of every installed package is documented in docs/plugins.md."""

from __future__ import annotations

import re
from pathlib import Path

from relayrl.core.plugins import create_plugin_manager, describe_hookspecs

ROOT = Path(__file__).resolve().parent.parent


def test_every_hookspec_has_a_docstring_and_a_section_in_plugins_md():
    specs = describe_hookspecs(create_plugin_manager())
    assert "relayrl_core_stores" in specs
    text = (ROOT / "docs/plugins.md").read_text()
    documented = set(re.findall(r"^#{2,4} `(relayrl_\w+)`", text, flags=re.MULTILINE))
    undocumented = sorted(set(specs) - documented)
    assert not undocumented, f"add a section '### `name`' to docs/plugins.md for: {undocumented}"
    assert not [name for name, doc in specs.items() if not doc.strip()], "every hookspec needs a docstring"
    stale = sorted(documented - set(specs))
    assert not stale, f"docs/plugins.md documents hooks that no installed package defines: {stale}"


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    command = next(line for line in ci.splitlines() if "nox" in line and not line.startswith("#"))
    assert command.strip() in readme, "README's test command and .ci/run have drifted apart"


def test_docs_links_resolve():
    pages = _results_module().DOCS
    assert ROOT / "packages" / "environments" / "README.md" in pages and ROOT / "plugins" / "relayrl-ray" / "README.md" in pages
    for page in pages:
        for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def _results_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_results", ROOT / "benchmarks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_docs_block_equals_its_benchmark_results_file():
    """Numbers in `<!-- results: NAME -->` blocks come from benchmarks/results/NAME.json, never typed."""
    results = _results_module()
    blocks = [match["name"] for page in results.DOCS for match in results.BLOCK.finditer(page.read_text())]
    assert "async_vs_sync-quickstart" in blocks
    assert not results.stale_blocks(), "run `python benchmarks/results.py`: " + "; ".join(results.stale_blocks())


def test_a_docs_block_that_disagrees_with_its_results_file_is_found_and_rewritten(tmp_path):
    results = _results_module()
    folder = tmp_path / "results"
    results.write_results("demo", command="python benchmarks/demo.py", markdown="| a |\n|---|\n| 1.00 |",
                          data={"a": 1.0}, folder=folder)
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- results: demo -->\n| a |\n|---|\n| 2.00 |\n<!-- /results -->\nafter\n")
    assert results.stale_blocks([page], folder) == [f"{page}: block 'demo' differs from benchmarks/results/demo.json"]
    assert results.stale_blocks([page], folder, fix=True)
    assert results.stale_blocks([page], folder) == []
    text = page.read_text()
    assert "| 1.00 |" in text and "| 2.00 |" not in text and text.startswith("intro\n") and text.endswith("after\n")
    assert "`python benchmarks/demo.py`" in text  # where the numbers came from
    page.write_text("<!-- results: missing -->\nx\n<!-- /results -->\n")
    assert "has no benchmarks/results/missing.json" in results.stale_blocks([page], folder)[0]


def test_a_results_file_from_a_changed_tree_says_so_whatever_the_environment_says(tmp_path, monkeypatch):
    results = _results_module()
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "one")
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.delenv("RELAYRL_COMMIT", raising=False)
    clean = results.commit()
    assert len(clean) == 12 and "+" not in clean
    (tmp_path / "a.py").write_text("x = 2\n")
    assert results.commit() == clean + "+dirty"
    monkeypatch.setenv("RELAYRL_COMMIT", clean)  # naming the commit does not hide the change
    assert results.commit() == clean + "+dirty"
    monkeypatch.setenv("RELAYRL_COMMIT", "0123456789ab")  # a commit this history cannot check
    assert results.commit() == "0123456789ab+unverified"
    monkeypatch.setattr(results, "ROOT", tmp_path / "no-such-folder")
    monkeypatch.delenv("RELAYRL_COMMIT")
    assert results.commit() == "unknown"
