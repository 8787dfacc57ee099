"""``relayrl report RUN_DIR``: write an HTML + Markdown report with plots of a run."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write an HTML/Markdown report with plots of a run",
                                   description="Plots reward, entropy, mismatch KL, staleness, lengths, "
                                               "throughput, weight-sync timings and alarms of RUN_DIR.")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--output", "-o", default=None, help="output folder (default RUN_DIR/report)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from relayrl.cli.report import write_report

    report = write_report(args.run_dir, args.output)
    print(f"report: {report.html_path} ({len(report.plots)} plots)")
    for key, value in report.summary.items():
        print(f"  {key.replace('_', ' ')}: {value}")
    return 0
