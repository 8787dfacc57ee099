"""``relayrl data``: task-set tools.

* ``relayrl data verify TASKS``: keep only tasks whose verifier can be trusted (needs relayrl-sandbox;
  the implementation is :mod:`relayrl.sandbox.verify`, imported lazily so that ``relayrl`` works
  without it).
* ``relayrl data filter SET --model MODEL --keep "0.1 <= pass_rate <= 0.9"``: measure each task's
  pass rate with ``relayrl eval`` and write the tasks in the band as a task set
  (:mod:`relayrl.cli.evals.filter`).
"""

from __future__ import annotations

import argparse

from relayrl.core.errors import RelayrlError
from relayrl.core.plugins import get_plugin_manager


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
    filter_ = actions.add_parser(
        "filter", help="measure each task's pass rate with a model; write the tasks in a band as a task set",
        description="Evaluates every task of SET (relayrl eval's engines, sandbox and grader) and writes those "
                    "satisfying --keep, with their measured pass_rate in metadata, to --out (JSONL).")
    filter_.add_argument("tasks", metavar="SET", help="environment name or task file/directory (as relayrl eval --tasks)")
    filter_.add_argument("--model", metavar="MODEL", default=None,
                         help="model directory, RUN_DIR or RUN_DIR@VERSION (default: the one --records evaluated)")
    filter_.add_argument("--keep", required=True, metavar="CONDITION",
                         help='e.g. "0.1 <= pass_rate <= 0.9" (names: pass_rate, mean_reward, passed, samples)')
    filter_.add_argument("--out", metavar="FILE", default=None, help="the filtered task set (default filtered-SET.jsonl)")
    filter_.add_argument("--records", metavar="DIR", default=None,
                         help="a relayrl eval output to reuse and continue (default FILE.eval)")
    filter_.add_argument("--split", default="train", choices=("auto", "eval", "train"))
    filter_.add_argument("--limit", type=int, default=None, metavar="N")
    filter_.add_argument("--samples", type=int, default=8, metavar="N")
    filter_.add_argument("--seed", type=int, default=0)
    filter_.add_argument("--pass-threshold", type=float, default=1.0, metavar="R")
    filter_.add_argument("--config", metavar="FILE", default=None)
    filter_.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    filter_.set_defaults(handler=_run_filter)


def _run_verify(args: argparse.Namespace) -> int:
    from relayrl.sandbox.verify import run

    return run(args)


def _sandbox_missing(args: argparse.Namespace) -> int:
    raise RelayrlError("relayrl data verify needs relayrl-sandbox (pip install ./packages/sandbox from a clone)")


def _run_filter(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from relayrl.cli.evals.filter import histogram, parse_keep, task_rows, write_task_set
    from relayrl.cli.evals.model import resolve_model, with_weights
    from relayrl.cli.evals.runner import EvalOptions, run_eval

    keep = parse_keep(args.keep)  # a bad condition fails before anything is evaluated
    name = Path(args.tasks).stem if Path(args.tasks).exists() else args.tasks
    out = Path(args.out or f"filtered-{name}.jsonl")
    records = Path(args.records) if args.records else out.with_name(out.name + ".eval")
    model_spec = args.model
    if model_spec is None:
        try:
            spec = json.loads((records / "eval.json").read_text())["spec"]
        except (OSError, ValueError, KeyError):
            raise RelayrlError("relayrl data filter needs --model (or --records naming an earlier eval)") from None
        model_spec = spec["model"] + (f"@{spec['version']}" if spec["version"] else "")
    pm = get_plugin_manager()
    model = with_weights(resolve_model(model_spec, overrides=args.overrides, config_file=args.config, pm=pm), records)
    options = EvalOptions(tasks=args.tasks, split=args.split, limit=args.limit, samples=args.samples, ks=(1,),
                          seed=args.seed, pass_threshold=args.pass_threshold)
    summary, task_set = run_eval(model, options, records, pm=pm)
    rows = task_rows(summary)
    kept = write_task_set(task_set.tasks, rows, keep, out)
    print(f"pass rates of {len(rows)} tasks ({args.samples} samples each, {model.label}): {histogram(rows)}")
    print(f"kept {len(kept)} of {len(rows)} tasks with {args.keep}: {out}  (records: {records})")
    return 0
