"""What ``relayrl eval MODEL`` evaluates: a model directory, or a run's weights at one version.

* A Hugging Face model directory (``config.json`` with a ``model_type``): served as it is, at
  policy version 0, with the run config given by ``--config`` (or the defaults) for everything else.
* A run directory (``RUN_DIR``): its newest published weights; ``RUN_DIR@N``: version ``N``. The
  run's own config supplies the tokenizer, chat format, harness, sampling and environment options.
  The version is rebuilt from the run's weight bus (newest snapshot at or below it, then its XOR
  deltas, checksums verified: weight sync's own route) into a model directory under the eval's
  output, so every engine backend loads it like any checkpoint. A version that retention has
  deleted is refused with the versions still on the bus.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from relayrl.core.config import Config, load_config
from relayrl.core.errors import RelayrlError
from relayrl.core.plugins import PluginManager

__all__ = ["EvalModel", "quiet_transformers", "resolve_model", "split_spec", "with_weights"]

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")


@dataclasses.dataclass(frozen=True)
class EvalModel:
    """A model ready to serve, and the config that says how."""

    model_dir: Path | None
    """A Hugging Face directory holding exactly the weights to evaluate (and the tokenizer); for a
    run, ``None`` until :func:`with_weights` rebuilt its version."""
    config: Config
    version: int
    """The policy version those weights are (0 for a model directory)."""
    label: str
    """How the summary names it: ``runs/quickstart@v131``, or the directory."""
    run_dir: Path | None = None


def split_spec(spec: str) -> tuple[Path, int | None]:
    """``DIR`` or ``DIR@N`` -> (directory, version or None)."""
    base, sep, version = spec.rpartition("@")
    if sep and version.isdigit() and Path(base).is_dir():
        return Path(base), int(version)
    return Path(spec), None


def _is_hf_model(path: Path) -> bool:
    try:
        return "model_type" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def resolve_model(spec: str, *, overrides: list[str], config_file: str | None, pm: PluginManager | None = None) -> EvalModel:
    """The model ``spec`` names and its config (a run's weights are rebuilt by :func:`with_weights`)."""
    from relayrl.cli.run.layout import RunLayout

    path, version = split_spec(spec)
    if not path.is_dir():
        raise RelayrlError(f"{spec}: no such directory (MODEL is a model directory, RUN_DIR or RUN_DIR@VERSION)")
    if _is_hf_model(path):
        if version is not None:
            raise RelayrlError(f"{spec}: a model directory has no versions (only a run directory does)")
        # The config's own [model] (a path that may not exist here, a fresh model's init) gives way to
        # MODEL before it is checked; its tokenizer and chat format still apply.
        given = [f"model.path={json.dumps(str(path.resolve()))}", "model.init={}", *overrides]
        config = load_config(config_file if config_file is not None else {}, overrides=given, pm=pm)
        return EvalModel(model_dir=path.resolve(), config=config, version=0, label=str(path))
    layout = RunLayout(path)
    if not layout.exists():
        raise RelayrlError(f"{spec}: neither a model directory (config.json with a model_type) nor a run "
                           "directory (config.json written by relayrl run)")
    if config_file is not None:
        raise RelayrlError("--config applies to a model directory; a run directory brings its own config "
                           "(change it with --set)")
    config = layout.load_config(overrides=overrides, pm=pm)
    version = version if version is not None else _newest_version(layout, config, spec)
    return EvalModel(model_dir=None, config=config, version=version, label=f"{path}@v{version}",
                     run_dir=layout.root)


def with_weights(model: EvalModel, cache_dir: Path) -> EvalModel:
    """``model`` with a model directory to serve: a run's version rebuilt under ``cache_dir`` (once)."""
    from relayrl.cli.run.layout import RunLayout

    if model.run_dir is None:
        return model
    target = materialize_version(RunLayout(model.run_dir), model.config, model.version,
                                 cache_dir / f"model-v{model.version}")
    return dataclasses.replace(model, model_dir=target)


def _weight_bus(layout: Any, config: Config) -> Any:
    from relayrl.weight_sync import WeightBus

    return WeightBus(layout.bus(config), config.weight_sync.prefix)


def _newest_version(layout: Any, config: Config, spec: str) -> int:
    newest = _weight_bus(layout, config).newest_version()
    if newest is None:
        raise RelayrlError(f"{spec}: the run has published no weights yet")
    return newest


def quiet_transformers() -> None:
    """No progress bar per engine load: the eval prints its own progress."""
    try:
        from transformers.utils import logging
    except ImportError:
        return
    logging.disable_progress_bar()


def materialize_version(layout: Any, config: Config, version: int, target: Path) -> Path:
    """The run's weights at ``version`` as a model directory at ``target`` (kept: a second eval reuses it)."""
    from relayrl.rollout.models import load_model
    from relayrl.weight_sync import Controller, StateDictAdapter, VersionUnavailable, WeightSyncError

    if (target / "config.json").exists():
        return target
    bus = _weight_bus(layout, config)
    if not bus.exists(version):
        available = bus.committed_versions()
        shown = ", ".join(map(str, available[-8:])) if available else "none"
        raise RelayrlError(f"{layout.root}@{version}: no such weight version on the run's bus (newest: {shown})")
    source = layout.model_path(config)
    quiet_transformers()
    # The bus holds the engines' representation (low-precision rollouts: [rollout] engine_dtype).
    model = load_model(source, dtype=config.rollout.serving_dtype(config.model))
    controller = Controller(layout.bus(config), StateDictAdapter(model), prefix=config.weight_sync.prefix)
    try:
        controller.update_to(version)
    except (VersionUnavailable, WeightSyncError) as exc:
        raise RelayrlError(f"{layout.root}@{version}: cannot rebuild this version ({exc})") from None
    finally:
        controller.close()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for item in source.iterdir():  # tokenizer, chat template, generation config: everything but the weights
        if item.is_file() and not item.name.endswith(WEIGHT_FILES) and not item.name.endswith(".index.json"):
            shutil.copy2(item, partial / item.name)
    model.save_pretrained(partial)
    partial.rename(target)
    return target
