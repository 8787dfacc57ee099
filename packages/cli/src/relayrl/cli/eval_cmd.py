"""``relayrl eval MODEL --tasks SET``: pass@k, rewards and cost per solved task, on the training path.

MODEL is a Hugging Face model directory, a run directory (its newest published weights) or
``RUN_DIR@VERSION``; SET an environment name (its held-out split by default) or a task file. The
work is in :mod:`relayrl.cli.evals`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _ks(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"k must be at least 1, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="evaluate a model or a run's weights on a task set: pass@k, rewards, cost per solved task",
        description="Samples every task --samples times with the run's engines, harness, sandbox and grader "
                    "(exploit detectors included: a flagged sample fails), and writes per-sample records, a "
                    "summary (JSON, markdown) and an HTML page with the trajectories to --out. Deterministic for "
                    "a --seed; run the same command again to continue an interrupted eval.")
    parser.add_argument("model", metavar="MODEL", help="model directory, RUN_DIR (newest weights) or RUN_DIR@VERSION")
    parser.add_argument("--tasks", required=True, metavar="SET",
                        help="environment name (countdown, code, code-search, ...) or a task file/directory")
    parser.add_argument("--split", default="auto", choices=("auto", "eval", "train"),
                        help="an environment's held-out (eval) or training tasks; auto: held out when it has them")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N tasks")
    parser.add_argument("--samples", type=int, default=8, metavar="N", help="samples per task (default 8)")
    parser.add_argument("--k", type=_ks, default=None, metavar="K[,K...]",
                        help="pass@k to report (default 1 and --samples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pass-threshold", type=float, default=1.0, metavar="R",
                        help="a sample passes with reward >= R and no detector flag (default 1.0)")
    parser.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="tasks in flight (default [rollout] max_concurrent_groups)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="output directory (default RUN_DIR/eval/<set>-v<version>, or evals/<model>-<set>)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="run config for a model directory (harness, sampling, engines, sandbox)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value (repeatable; parsed as TOML)")
    parser.add_argument("--price-per-mtok", type=float, default=None, metavar="PRICE",
                        help="price per million generated tokens: adds a price per solved task")
    parser.add_argument("--price-per-gpu-hour", type=float, default=None, metavar="PRICE",
                        help="price per engine-hour: adds a price per solved task")
    parser.set_defaults(handler=run)


def default_out(model: str, tasks: str, version: int, run_dir: Path | None) -> Path:
    name = Path(tasks).name if Path(tasks).exists() else tasks
    if run_dir is not None:
        return run_dir / "eval" / f"{name}-v{version}"
    return Path("evals") / f"{Path(model).resolve().name}-{name}"


def run(args: argparse.Namespace) -> int:
    from relayrl.cli.evals.model import resolve_model, split_spec, with_weights
    from relayrl.cli.evals.output import PER_TASK_ROWS, markdown
    from relayrl.cli.evals.runner import EvalOptions, run_eval
    from relayrl.core.errors import RelayrlError
    from relayrl.core.plugins import get_plugin_manager

    if args.samples < 1:
        raise RelayrlError("--samples must be at least 1")
    pm = get_plugin_manager()
    options = EvalOptions(tasks=args.tasks, split=args.split, limit=args.limit, samples=args.samples,
                          ks=args.k or tuple(sorted({1, args.samples})), seed=args.seed,
                          pass_threshold=args.pass_threshold, concurrency=args.concurrency,
                          price_per_million_tokens=args.price_per_mtok, price_per_gpu_hour=args.price_per_gpu_hour)
    model = resolve_model(args.model, overrides=args.overrides, config_file=args.config, pm=pm)
    out = Path(args.out) if args.out else default_out(str(split_spec(args.model)[0]), args.tasks, model.version,
                                                      model.run_dir)
    model = with_weights(model, out)
    try:
        summary, _ = run_eval(model, options, out, pm=pm)
    except KeyboardInterrupt:
        print(f"interrupted; run the same command to continue ({out})")
        return 130
    print(markdown(summary, options.ks, title=f"{model.label} on {args.tasks}", max_tasks=PER_TASK_ROWS))
    print(f"records: {out / 'samples.jsonl'}\nsummary: {out / 'summary.json'}\npage: {out / 'index.html'}")
    return 0

