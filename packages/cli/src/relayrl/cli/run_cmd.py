"""``relayrl run CONFIG`` / ``relayrl run --resume RUN_DIR``: one asynchronous RL run on this machine."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from relayrl.core.plugins import PluginManager


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="start (or resume) an asynchronous RL run: engines, rollout manager and trainer",
        description="Validates CONFIG, then starts the trainer, the engine servers and the rollout manager as "
                    "local processes talking through the run directory (or [store] url), supervises them and "
                    "shows progress. Ctrl-C stops everything cleanly; --resume continues a stopped run.")
    parser.add_argument("config", metavar="CONFIG", nargs="?", help="TOML run config (not with --resume)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint")
    parser.add_argument("--run-dir", metavar="DIR", help="where the run lives (default runs/<run.name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value (repeatable; parsed as TOML)")
    parser.add_argument("--steps", type=int, default=None, help="shorthand for --set trainer.steps=N")
    parser.add_argument("--launcher", default=None, metavar="NAME",
                        help="where the processes run (relayrl_cli_launchers: local, ray, ...); "
                             "shorthand for --set launcher.backend=NAME")
    parser.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from relayrl.cli.run.display import Display
    from relayrl.cli.run.launcher import Launcher
    from relayrl.cli.run.layout import RunLayout
    from relayrl.cli.run.lease import RunLease
    from relayrl.core.config import ConfigError, load_config
    from relayrl.core.plugins import get_plugin_manager

    overrides = list(args.overrides) + ([f"trainer.steps={args.steps}"] if args.steps is not None else [])
    if args.launcher is not None:
        overrides.append(f"launcher.backend={json.dumps(args.launcher)}")
    pm = get_plugin_manager()
    if args.resume:
        if args.config:
            raise ConfigError("give either CONFIG or --resume RUN_DIR (a resumed run keeps its own config)")
        layout = RunLayout(args.resume)
        if not layout.exists():
            raise ConfigError(f"--resume {args.resume}: not a run directory (no config.json)")
        config = layout.load_config(overrides=overrides, pm=pm)
        if not never_started(layout, config):  # nothing was made with the old values: any fix is fine
            _refuse_frozen_changes(layout.load_config(pm=pm).raw, config.raw)
    else:
        if not args.config:
            raise ConfigError("relayrl run needs CONFIG (or --resume RUN_DIR)")
        config = load_config(args.config, overrides=overrides, pm=pm)
        absolute = _absolute_bus_url(config.store.url)
        if absolute != config.store.url:  # recorded absolute: a --resume from elsewhere finds the same bus
            config = load_config(args.config, overrides=[*overrides, f"store.url={json.dumps(absolute)}"], pm=pm)
        layout = RunLayout(args.run_dir or Path("runs") / config.run.name)
        if layout.exists() and never_started(layout, config):
            print(f"{layout.root} holds a run that never started (no checkpoint, nothing on its bus): "
                  f"starting it over with this config", flush=True)
        elif layout.exists():
            raise ConfigError(f"{layout.root} already holds a run: continue it with --resume {layout.root}, "
                              "or choose another --run-dir")
    polls = _synchronous_polls(config)
    if polls:
        config = (layout.load_config(overrides=[*overrides, *polls], pm=pm) if args.resume
                  else load_config(args.config, overrides=[*overrides, f"store.url={json.dumps(config.store.url)}", *polls],
                                   pm=pm))
    _preflight(config, pm)
    problem = _bus_problem(layout, config)
    if problem:
        raise ConfigError(problem)
    # One launcher per run, taken before anything in the run directory or on its bus is written.
    lease = RunLease(layout.bus(config), ttl_s=config.run.lease_ttl_s, where=f"run {layout.root}")
    lease.acquire()
    try:
        if not args.resume and layout.exists() and not never_started(layout, config):
            # another launcher created it while this one started
            raise ConfigError(f"{layout.root} already holds a run: continue it with --resume {layout.root}")
        backend = _launcher_backend(config, pm, layout.root)  # a cluster launcher connects here
        layout.create(config.raw)
        display = Display(layout, total_steps=config.trainer.steps)
        launcher = Launcher(layout, config, on_tick=display.tick, lease=lease, backend=backend)
        previous = {signum: signal.signal(signum, lambda *_: launcher.stop())
                    for signum in (signal.SIGINT, signal.SIGTERM)}
        print(f"run directory: {layout.root}  (logs in {layout.logs})", flush=True)
        print(backend.describe(), flush=True)
        try:
            status = launcher.run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            display.close()
    finally:
        lease.release()
    if status == 0 and not args.no_report:
        _report(layout.root)
    if status == 130:
        print(f"stopped; continue with: relayrl run --resume {layout.root}")
    return status


def never_started(layout: Any, config: Any) -> bool:
    """Whether the run in ``layout`` left nothing to continue: no checkpoint in its directory and
    nothing on its bus (no weights, no rollouts). Such a run (its trainer failed to start, say) is
    started over by ``relayrl run CONFIG`` and takes any fix on ``--resume``."""
    if any(layout.root.glob("checkpoints/*")):
        return False
    try:
        bus = layout.bus(config)
        return not any(bus.list(f"{prefix.strip('/')}/") for prefix in (config.weight_sync.prefix, config.buffer.prefix))
    except Exception:  # a bus that cannot be read says nothing: not known to be empty
        return False


def _absolute_bus_url(url: str) -> str:
    """``[store] url`` with a relative directory made absolute (against the directory ``relayrl run``
    started in); other URLs as they are."""
    if not url or ("://" in url and not url.startswith("file://")):
        return url
    path = Path(url.removeprefix("file://")).expanduser()
    return url if path.is_absolute() else str(path.resolve())


def _bus_problem(layout: Any, config: Any) -> str | None:
    """Why the run's bus cannot be used, in one line (None when a listing of it works)."""
    url = layout.bus_url(config)
    try:
        layout.bus(config).list(f"{config.weight_sync.prefix.strip('/')}/")
    except Exception as exc:  # whatever the backend raises (a socket error, an auth error): said in one line
        detail = " ".join(str(exc).split())[:200]
        return f"store.url: the bus {url!r} cannot be reached ({type(exc).__name__}: {detail})"
    return None


FROZEN_ON_RESUME = ("model", "store", "weight_sync.prefix", "trainer.backend")
"""Config keys a resumed run cannot change: its checkpoints, bus and published weights were made with them."""


def _refuse_frozen_changes(before: dict[str, Any], after: dict[str, Any]) -> None:
    from relayrl.core.config import ConfigError

    for key in FROZEN_ON_RESUME:
        changed = _first_difference(_value(before, key), _value(after, key), key)
        if changed is not None:
            name, old, new = changed
            raise ConfigError(f"{name}: cannot change on --resume (the run's checkpoints and weights were made with "
                              f"{_shown(old)}, the override asks for {_shown(new)}); start a new run instead")


_ABSENT = object()


def _value(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part, _ABSENT) if isinstance(data, dict) else _ABSENT
    return data


def _first_difference(old: Any, new: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first dotted key under ``path`` whose value differs, with both values (or None)."""
    if (isinstance(old, dict) and new is _ABSENT) or (isinstance(new, dict) and old is _ABSENT):
        old, new = ({} if old is _ABSENT else old), ({} if new is _ABSENT else new)
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{path}.{key}")
            if found is not None:
                return found
        return None
    return None if old == new else (path, old, new)


def _shown(value: Any) -> str:
    return "it unset" if value is _ABSENT else repr(value)


def _launcher_backend(config: Any, pm: PluginManager | None, run_dir: Path) -> Any:
    """The ``[launcher]`` backend, built (a cluster launcher connects to its cluster here)."""
    from relayrl.cli.hookspecs import LAUNCHERS
    from relayrl.core.config import resolve_plugin

    section = config.launcher
    record, options = resolve_plugin(pm, LAUNCHERS, section.backend, section.options, path="launcher.backend",
                                     options_path="launcher.options")
    return record.factory(options=options, world=config.trainer.ranks, run_dir=run_dir)


def _preflight(config: Any, pm: PluginManager | None) -> None:
    """Fail before anything starts: no model, or a sandbox this host cannot provide."""
    from relayrl.core.config import ConfigError

    if not config.model.configured:
        raise ConfigError("model: set model.path (a model directory) or model.init (a fresh model's options)")
    from relayrl.cli.run.colocate import colocation_problem

    problem = colocation_problem(config)
    if problem:
        raise ConfigError(problem)
    if config.rollout.environment in ("countdown", "code"):
        from relayrl.sandbox.config import describe_protections, open_backend

        print(describe_protections(open_backend(section=config.sandbox, pm=pm)), flush=True)


def _report(run_dir: Path) -> None:
    try:
        from relayrl.cli.report import write_report
    except ImportError:
        return
    from relayrl.core.errors import RelayrlError

    try:
        report = write_report(run_dir, None)
    except (ImportError, RelayrlError) as exc:  # matplotlib not installed: the run itself succeeded
        print(f"report skipped ({exc})")
        return
    print(f"report: {report.html_path}")
    for key, value in report.summary.items():
        print(f"  {key.replace('_', ' ')}: {value}")


def _synchronous_polls(config: Any) -> list[str]:
    """Overrides that lower the trainer's buffer poll and the engines' manifest poll to
    ``SYNCHRONOUS_POLL_S`` in ``[rollout] synchronous`` mode (generation and training alternate, so every
    poll interval is idle time of the whole run); none otherwise."""
    from relayrl.rollout.config import SYNCHRONOUS_POLL_S

    if not config.rollout.synchronous:
        return []
    return [f"{key}={SYNCHRONOUS_POLL_S}" for key, value in (("buffer.poll_interval_s", config.buffer.poll_interval_s),
                                                              ("weight_sync.poll_interval_s", config.weight_sync.poll_interval_s))
            if value > SYNCHRONOUS_POLL_S]
