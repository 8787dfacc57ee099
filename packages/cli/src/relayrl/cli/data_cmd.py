"""``relayrl data verify TASKS``: keep only tasks whose verifier can be trusted (needs relayrl-sandbox).

The implementation is :mod:`relayrl.sandbox.verify`; this module only wires it into the command,
importing it lazily so that ``relayrl`` works without relayrl-sandbox installed.
"""

from __future__ import annotations

import argparse

from relayrl.core.errors import RelayrlError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="task data tools")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify", help="gold patch must pass, empty and mutated gold must fail; write the fit tasks",
        description="Verify each task's grader in its real sandbox; print a table and write the ids of fit tasks.")
    try:
        from relayrl.sandbox.verify import add_arguments
    except ImportError:
        verify.add_argument("tasks", metavar="TASKS")
        verify.add_argument("options", nargs=argparse.REMAINDER)
        verify.set_defaults(handler=_sandbox_missing)
    else:
        add_arguments(verify)
        verify.set_defaults(handler=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from relayrl.sandbox.verify import run

    return run(args)


def _sandbox_missing(args: argparse.Namespace) -> int:
    raise RelayrlError("relayrl data verify needs relayrl-sandbox: pip install relayrl-sandbox")
