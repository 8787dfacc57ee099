"""Where the parts of a run live, and how every process of the run loads its config and store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from relayrl.core.config import Config, load_config
from relayrl.core.plugins import PluginManager
from relayrl.core.store import Store, open_store

__all__ = ["RunLayout"]


_warned: set[tuple[str, str]] = set()


def warn_once(what: str, exc: Exception) -> None:
    """Say on stderr, once per (what, cause), that a bookkeeping write failed and the run goes on."""
    cause = str(getattr(exc, "errno", None) or type(exc).__name__)
    if (what, cause) not in _warned:
        _warned.add((what, cause))
        print(f"relayrl run: could not write {what} ({getattr(exc, 'strerror', None) or exc}); the run goes on",
              file=sys.stderr, flush=True)


class RunLayout:
    """Paths of one run directory.

    ``config.json`` is the resolved config (file plus ``--set`` overrides) that every process of
    the run reads, so a resumed run trains exactly what was started. The bus (rollout segments,
    weight versions, trainer progress) is ``[store] url`` when set, else the run directory itself;
    checkpoints always go to the run directory (node-local disk), replicated to any peers.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.root = Path(run_dir).resolve()
        self.config_path = self.root / "config.json"
        self.model_dir = self.root / "model"
        self.logs = self.root / "logs"
        self.status = self.root / "status"
        self.eval_results = self.root / "eval"
        """Where ``[eval]`` writes the run's held-out evaluations (``run.jsonl``, ``step-NNNNNN.jsonl``);
        ``relayrl eval RUN_DIR`` writes to folders inside it."""
        self._local: Store | None = None

    def create(self, raw_config: dict[str, Any]) -> None:
        for path in (self.root, self.logs, self.status):
            path.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(raw_config, indent=2, sort_keys=True) + "\n")

    def exists(self) -> bool:
        return self.config_path.exists()

    def load_config(self, *, overrides: list[str] | tuple[str, ...] = (), pm: PluginManager | None = None) -> Config:
        return load_config(json.loads(self.config_path.read_text()), overrides=overrides, pm=pm)

    def bus_url(self, config: Config) -> str:
        return config.store.url or str(self.root)

    def sandbox_section(self, config: Config) -> Any:
        """The run's ``[sandbox]`` section with the run directory (and a local bus) hidden from every sandbox.

        The run directory holds other groups' answers on the bus, weights and checkpoints: nothing an
        agent or an answer under grading may read.
        """
        hidden = [str(self.root)]
        url = self.bus_url(config)
        if "://" not in url or url.startswith("file://"):
            hidden.append(str(Path(url.removeprefix("file://")).resolve()))
        section = config.sandbox
        return msgspec.structs.replace(section, hide_paths=[*section.hide_paths,
                                                             *(path for path in hidden if path not in section.hide_paths)])

    def bus(self, config: Config) -> Store:
        return open_store(self.bus_url(config), **dict(config.store.options))

    def checkpoint_store(self) -> Store:
        """The run directory as a store: checkpoints and events."""
        if self._local is None:
            self._local = open_store(str(self.root))
        return self._local

    def model_path(self, config: Config) -> Path:
        return Path(config.model.path).expanduser() if config.model.path else self.model_dir

    def write_status(self, name: str, data: dict[str, Any]) -> bool:
        """Atomically replace ``status/<name>.json`` (a process's own view, read by the launcher and trainer).

        Bookkeeping, not the run: when the file system refuses it (a full disk, a run directory being
        deleted) it is logged, once per cause, and the caller goes on; the next write replaces it.
        Whether it was written."""
        path = self.status / f"{name}.json"
        partial = path.with_suffix(".json.partial")
        try:
            self.status.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(data, sort_keys=True))
            partial.replace(path)
        except OSError as exc:
            warn_once(f"status/{name}.json", exc)
            return False
        return True

    def beat(self, name: str) -> None:
        """A sign of life of process ``name``: ``status/<name>.alive``'s time set to now (the launcher's
        liveness check reads it; see ``[rollout] liveness_timeout_s``). Needs no disk space once the
        file exists."""
        path = self.status / f"{name}.alive"
        try:
            try:
                os.utime(path)
            except FileNotFoundError:  # the first beat
                self.status.mkdir(parents=True, exist_ok=True)
                path.touch()
        except OSError as exc:
            warn_once(f"status/{name}.alive", exc)

    def read_status(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.status / f"{name}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
