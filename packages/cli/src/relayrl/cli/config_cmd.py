"""``relayrl config check FILE``: validate a run config before anything starts."""

from __future__ import annotations

import argparse
import json

from relayrl.core.config import load_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="work with run configs")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a config file against every installed package",
                               description="Validate FILE; errors name the dotted key (trainer.optimizer.lr).")
    check.add_argument("file", metavar="FILE")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override a value (repeatable); the value is parsed as TOML")
    check.add_argument("--show", action="store_true", help="print the resolved config, defaults included, as JSON")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    config = load_config(args.file, overrides=args.overrides)
    if args.show:
        print(json.dumps(config.to_builtins(), indent=2, default=str))
    else:
        print(f"ok: {args.file} ({', '.join(sorted(config.sections))})")
    return 0
