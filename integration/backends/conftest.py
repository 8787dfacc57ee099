"""``--cell engine=...,router=...,trainer=...,store=...`` selects the backend-matrix cell to run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cells.py (the import mode adds no test folders)

pytest_plugins = ["relayrl.core.testing.fixtures"]


def pytest_addoption(parser):
    parser.addoption("--cell", default=None, help="engine=E,router=R,trainer=T,store=S (integration/backends/cells.py)")


@pytest.fixture
def cell(request):
    from cells import parse_cell

    text = request.config.getoption("--cell")
    if text is None:
        pytest.fail("run this module through its nox session, which passes --cell (nox -s backends)")
    return parse_cell(text)
