"""relayrl-sandbox: isolated tool execution, workspaces, hidden-test grading, exploit detectors, verifier QA.

* :mod:`relayrl.sandbox.api`: the protocol (``Sandbox``, ``SandboxBackend``, ``Limits``, ``ExecResult``);
* :mod:`relayrl.sandbox.process`: the built-in ``process`` backend; :mod:`relayrl.sandbox.local`: what
  local backends share (plugins such as relayrl-bwrap subclass it);
* :mod:`relayrl.sandbox.workspace`: workspace preparation and diffs; :mod:`relayrl.sandbox.tools`: agent tools;
* :mod:`relayrl.sandbox.grading`: the isolated grader; :mod:`relayrl.sandbox.detectors`: exploit detectors;
* :mod:`relayrl.sandbox.task_sources`: where tasks come from (JSONL, task folders, plugins);
* :mod:`relayrl.sandbox.verify`: ``relayrl data verify``; :mod:`relayrl.sandbox.testing`: ``SandboxTests``.

The task domains that use these (their data, graders' tests and cheat suites) are in relayrl-environments.

Threat model: ``docs/sandbox.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Limits": "api", "ExecResult": "api", "Sandbox": "api", "SandboxBackend": "api", "SandboxError": "api",
    "SandboxUnavailable": "api", "CAPABILITIES": "api",
    "SandboxSection": "config", "open_backend": "config", "backends": "config", "exploit_detectors": "config",
    "task_sources": "config",
    "ProcessBackend": "process",
    "prepare_workspace": "workspace", "workspace_diff": "workspace",
    "ToolBox": "tools",
    "Grader": "grading", "GradeReport": "grading",
    "DetectionContext": "detectors", "run_detectors": "detectors",
    "load_tasks": "task_sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relayrl.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"relayrl.sandbox.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
