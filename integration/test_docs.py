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
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
