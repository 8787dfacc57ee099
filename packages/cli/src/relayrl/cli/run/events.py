"""Run events (``RunEvent`` under ``events/`` in the run directory's store): what ``relayrl report`` lists."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from relayrl.cli.run.layout import RunLayout, warn_once
from relayrl.core import codec, wire
from relayrl.core.errors import StoreError

__all__ = ["write_event"]

_sequence = itertools.count()


def write_event(layout: RunLayout, source: str, kind: str, message: str, *, level: str = "info",
                data: dict[str, Any] | None = None) -> None:
    """Record one event; keys sort by time, and are unique per process. An event the run directory
    refuses (a full disk) is said on stderr, once per cause, and lost: the run goes on."""
    now = time.time()
    event = wire.RunEvent(time=now, source=source, kind=kind, level=level, message=message, data=dict(data or {}))
    key = f"events/{now:017.6f}-{source}-{os.getpid()}-{next(_sequence)}"
    try:
        layout.checkpoint_store().put(key, codec.encode(event))
    except (OSError, StoreError) as exc:
        warn_once("an event", exc)
