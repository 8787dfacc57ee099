"""Entry point of the ``relayrl`` command.

Every subcommand lives in its own module and exposes ``add_parser(subparsers)``. Errors that a
user can fix (:class:`relayrl.core.errors.RelayrlError`, and an ``OSError`` naming a path: read-only,
a file in the way, no space) are printed as one line, ``relayrl: error: ...``, with exit status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from relayrl.cli import config_cmd, data_cmd, eval_cmd, model_cmd, plugins_cmd, report_cmd, run_cmd, view_cmd
from relayrl.core.errors import RelayrlError

COMMANDS = (run_cmd, eval_cmd, report_cmd, view_cmd, model_cmd, plugins_cmd, config_cmd, data_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relayrl", description="Asynchronous RL for LLM coding agents.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RelayrlError as exc:
        print(f"relayrl: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave (a socket, a child): a bug, with its traceback
            raise
        # A path that cannot be created, read or written (read-only, a file in the way, no space).
        print(f"relayrl: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `relayrl plugins | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
