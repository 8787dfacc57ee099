"""``relayrl view RUN_DIR``: write the trajectory viewer, a static HTML page of what the agents did."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("view", help="write a static HTML page to browse a run's trajectories",
                                   description="Sampled trajectories per step and group: turns with tokens shaded "
                                               "by probability, tool calls and results, compactions, rewards, "
                                               "grader reports and detector flags. Works offline, no server.")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--step", type=int, default=None, help="every group this trainer step trained or dropped")
    parser.add_argument("--groups-per-step", type=int, default=2, help="groups shown per step (default 2)")
    parser.add_argument("--output", "-o", default=None, help="output file (default RUN_DIR/report/trajectories.html)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from relayrl.cli.view import write_viewer

    path = write_viewer(args.run_dir, args.output, step=args.step, groups_per_step=args.groups_per_step)
    print(f"trajectories: {path}")
    return 0
