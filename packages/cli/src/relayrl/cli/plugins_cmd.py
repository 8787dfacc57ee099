"""``relayrl plugins``: every loaded plugin, where it comes from, and what it implements."""

from __future__ import annotations

import argparse
import json
from typing import Any

from relayrl.core.plugins import create_plugin_manager, registrations


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plugins", help="list installed plugins and the hooks they implement",
                                   description="List installed plugins, their distribution, version and hooks.")
    parser.add_argument("--registrations", "-r", action="store_true",
                        help="also list what each registration hook provides, by name")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    pm = create_plugin_manager()
    plugins = [
        {
            "name": info.name,
            "distribution": info.distribution or "-",
            "version": info.version or "-",
            "kind": "built-in" if info.builtin else "plugin",
            "hooks": pm.hooks_of(info.name),
        }
        for info in pm.plugin_infos.values()
    ]
    # Gathering every registry also validates it: a duplicate name fails here, naming both plugins.
    registries = _registries(pm)
    if args.json:
        print(json.dumps({"plugins": plugins, "registrations": registries}, indent=2))
        return 0
    headers = ("PLUGIN", "DISTRIBUTION", "VERSION", "KIND", "HOOKS")
    rows = [(p["name"], p["distribution"], p["version"], p["kind"], ", ".join(p["hooks"]) or "-") for p in plugins]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers) - 1)]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    if args.registrations:
        print()
        for hook_name, entries in registries.items():
            print(f"{hook_name}:")
            for entry in entries:
                declared = ", ".join(([f"options: {entry['config']}"] if entry["config"] else []) + entry["capabilities"])
                print(f"  {entry['name']:<20} {entry['plugin']:<20} {entry['description']}"
                      + (f" [{declared}]" if declared else ""))
    return 0


def _registries(pm) -> dict[str, list[dict[str, Any]]]:
    """Every registration hook's records: name, plugin, description, the options struct and the
    capabilities it declares."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for hook_name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, hook_name)
        spec = getattr(caller, "spec", None)
        # Registration hooks take no arguments and are not historic (relayrl_addhooks is).
        if spec is None or spec.argnames or spec.opts.get("historic") or spec.opts.get("firstresult"):
            continue
        tables[hook_name] = [
            {"name": record.name, "plugin": record.plugin, "description": record.description,
             "config": f"{record.config.__module__}.{record.config.__qualname__}" if record.config else None,
             "capabilities": sorted(record.capabilities)}
            for record in registrations(pm, hook_name).values()
        ]
    return tables
