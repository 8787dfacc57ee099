"""One launcher per run: a lease on the run's bus, with a heartbeat and fencing generations.

Two launchers on one run share its bus; their trainers would each train and commit the same groups
(a job scheduler's retry is enough). A launcher therefore holds the run's lease while it runs:

- The lease is the object ``lease/<generation>`` with the highest generation on the bus (the run
  directory, or ``[store] url``, so it also guards runs whose launchers sit on different hosts).
  Taking it is a conditional create of the next generation: of several launchers racing for it,
  exactly one wins, on local files and on S3 alike. The generation is a fencing token: a process
  started under generation ``g`` stops as soon as a generation above ``g`` exists.
- The holder rewrites its object every ``ttl_s / 6`` seconds (the heartbeat) and marks it released
  when it exits. A lease is free when it is released, when its holder is provably dead (same host
  and boot, and its process is gone or is another process under a reused pid: decided at once), or,
  for a holder on another host, when its heartbeat is older than ``ttl_s`` by this host's clock
  (clocks are assumed within a few seconds of each other). An unreadable lease object is free too: a
  holder that is in fact alive finds itself superseded at its next heartbeat and stops.
- A launcher that finds its lease superseded (it was paused past ``ttl_s`` and another took over)
  stops its fleet; trainer ranks check the fence before committing a step (:func:`check_fence`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from relayrl.core.errors import ObjectExists, RelayrlError, StoreError
from relayrl.core.processes import identity, is_dead
from relayrl.core.store import Store

__all__ = ["EXIT_FENCED", "FENCE_ENV", "LeaseHeld", "LeaseLost", "RunLease", "check_fence"]

PREFIX = "lease/"
FENCE_ENV = "RELAYRL_LEASE_GENERATION"
"""Environment variable through which the launcher hands its lease generation to its children."""
EXIT_FENCED = 76
"""Exit status of a child that found its launcher's lease superseded (never restarted)."""
DEFAULT_TTL_S = 60.0


class LeaseHeld(RelayrlError):
    """Another live launcher holds the run."""


class LeaseLost(RelayrlError):
    """A newer launcher took the run over: this one (or this child) must stop."""


def _key(generation: int) -> str:
    return f"{PREFIX}{generation:010d}"


def _generations(store: Store) -> list[int]:
    found = []
    for key in store.list(PREFIX):
        with contextlib.suppress(ValueError):
            found.append(int(key[len(PREFIX):]))
    return sorted(found)


class RunLease:
    """The lease of one run on ``store``; :meth:`acquire`, then :meth:`release` (or use it as a context)."""

    def __init__(self, store: Store, *, ttl_s: float = DEFAULT_TTL_S, where: str = "",
                 on_lost: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        if not ttl_s > 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.store = store
        self.ttl_s = float(ttl_s)
        self.where = where or store.url
        self.on_lost = on_lost
        """Called once, from the heartbeat thread, with a one-line reason when a newer launcher took over."""
        self.clock = clock
        self.generation: int | None = None
        self.lost: str | None = None
        self._record: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_failing_since: float | None = None

    # ------------------------------------------------------------------ records
    def _mine(self) -> dict[str, Any]:
        now = self.clock()
        return {"owner": uuid.uuid4().hex, **identity(), "started": now, "heartbeat": now, "beats": 0,
                "ttl_s": self.ttl_s, "released": False}

    def _read(self, generation: int) -> dict[str, Any] | None:
        """The record of ``generation``; None when it cannot be read (gone, damaged, not ours to parse)."""
        try:
            record = json.loads(self.store.get(_key(generation)))
        except (StoreError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def holder_alive(self, record: dict[str, Any] | None) -> bool:
        """Whether the launcher of ``record`` may still be running (see the module docstring)."""
        if record is None or record.get("released"):
            return False
        dead = is_dead(record)  # decided at once for a holder on this host
        if dead is not None:
            return not dead
        try:
            age = self.clock() - float(record["heartbeat"])
            ttl = max(float(record.get("ttl_s", self.ttl_s)), self.ttl_s)
        except (KeyError, TypeError, ValueError):
            return False
        return age < ttl

    @staticmethod
    def describe(record: dict[str, Any], now: float) -> str:
        beat = now - float(record.get("heartbeat", now))
        return (f"launcher pid {record.get('pid')} on host {record.get('host')} "
                f"(last heartbeat {max(beat, 0.0):.0f} s ago)")

    # ------------------------------------------------------------------ taking and keeping it
    def acquire(self) -> int:
        """Take the lease or raise :class:`LeaseHeld` naming its live holder; returns the generation."""
        generations = _generations(self.store)
        newest = generations[-1] if generations else 0
        if newest:
            record = self._read(newest)
            if self.holder_alive(record):
                assert record is not None
                wait = "" if record.get("host") == socket.gethostname() else \
                    f"; a crashed holder's lease expires {record.get('ttl_s', self.ttl_s):.0f} s after its last heartbeat"
                raise LeaseHeld(f"{self.where} is in use by {self.describe(record, self.clock())}: stop that run "
                                f"first (relayrl allows one launcher per run){wait}")
        mine = self._mine()
        generation = newest + 1
        try:
            self.store.put(_key(generation), json.dumps(mine).encode(), if_absent=True)
        except ObjectExists:
            won = self._read(generation)
            if won is None or won.get("owner") != mine["owner"]:  # a retried create that had landed is ours
                raise LeaseHeld(f"{self.where}: another launcher took the run at the same moment "
                                f"({self.describe(won, self.clock()) if won else 'lease ' + _key(generation)})") from None
        self.generation, self._record = generation, mine
        for older in generations:  # superseded generations: nobody reads them again
            with contextlib.suppress(StoreError):
                self.store.delete(_key(older))
        return generation

    def start_heartbeat(self) -> None:
        """Rewrite the lease every ``ttl_s / 6`` seconds in a daemon thread, watching for a newer generation."""
        if self.generation is None:
            raise RuntimeError("acquire() the lease before starting its heartbeat")
        self._thread = threading.Thread(target=self._beat_loop, name="run-lease", daemon=True)
        self._thread.start()

    def _beat_loop(self) -> None:
        interval = self.ttl_s / 6
        while not self._stop.wait(interval):
            self.beat()

    def beat(self) -> bool:
        """One heartbeat; False once the lease is lost (then ``on_lost`` has been called)."""
        if self.lost is not None:
            return False
        try:
            superseded = self._superseded()
            if superseded is None:
                self._record.update(heartbeat=self.clock(), beats=self._record["beats"] + 1)
                self.store.put(_key(self.generation), json.dumps(self._record).encode())
            self._beat_failing_since = None
        except (StoreError, OSError) as exc:  # the store may come back: keep beating; a newer generation decides
            if self._beat_failing_since is None:
                self._beat_failing_since = self.clock()
                print(f"relayrl run: the run lease's heartbeat failed ({exc}); retrying", flush=True)
            return True
        if superseded is not None:
            self.lost = (f"another launcher took over {self.where} (lease generation {superseded} > "
                         f"{self.generation}); this launcher stops its processes")
            if self.on_lost is not None:
                self.on_lost(self.lost)
            return False
        return True

    def _superseded(self) -> int | None:
        newer = [generation for generation in _generations(self.store) if generation > (self.generation or 0)]
        return newer[-1] if newer else None

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (a later launcher takes it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.generation is None or self.lost is not None:
            return
        with contextlib.suppress(StoreError):
            if self._superseded() is None:
                self._record.update(released=True, heartbeat=self.clock())
                self.store.put(_key(self.generation), json.dumps(self._record).encode())
        self.generation = None

    def __enter__(self) -> RunLease:
        self.acquire()
        self.start_heartbeat()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def check_fence(store: Store, generation: int | None = None) -> None:
    """Raise :class:`LeaseLost` when a lease newer than ``generation`` exists on ``store``.

    ``generation`` defaults to the launcher's (the ``RELAYRL_LEASE_GENERATION`` environment
    variable); a process started without one (by hand, in tests) is not fenced.
    """
    if generation is None:
        value = os.environ.get(FENCE_ENV, "")
        if not value.isdigit():
            return
        generation = int(value)
    newer = [found for found in _generations(store) if found > generation]
    if newer:
        raise LeaseLost(f"another launcher took over this run (lease generation {newer[-1]} > {generation}); "
                        "this process stops without committing")
