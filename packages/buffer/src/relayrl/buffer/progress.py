"""The two records through which the trainer and the rollout fleet see each other's progress.

* :class:`Progress` (object ``progress``, written by the trainer after every step and whenever it
  settles dropped groups): its step, its policy version, and how many groups of each producer it has
  consumed. Producers hold back when they are too far ahead of it (back-pressure) and periodic
  evaluations follow its step.
* :class:`FleetCounters` (object ``fleet/<producer>.json``, written by each producer about once a
  second): cumulative counts of what it graded, committed and skipped, and the reward and behaviour
  sums of everything graded. The trainer reports the fleet's success rate over each step from the
  difference of two reads, whether or not those groups were trained on.

Both are versioned wire messages (:mod:`relayrl.core.wire`): msgpack on the bus, new fields with
defaults, a reader refuses a record newer than it understands. Records written as JSON by relayrl
0.1 run directories are still read, so such runs resume.
"""

from __future__ import annotations

import json

from relayrl.core import codec
from relayrl.core.errors import ObjectNotFound, WireError
from relayrl.core.store import Store
from relayrl.core.wire import Versioned

__all__ = ["FLEET_PREFIX", "PROGRESS_KEY", "FleetCounters", "Progress", "read_fleet_counters", "read_progress",
           "write_fleet_counters", "write_progress"]

PROGRESS_KEY = "progress"
FLEET_PREFIX = "fleet/"


class Progress(Versioned, kw_only=True):
    """Where the trainer is: its step, its policy version, the groups it consumed per producer."""

    step: int = 0
    version: int = 0
    consumed: dict[str, int] = {}
    """Groups of each producer that the trainer trained on or settled as dropped."""


class FleetCounters(Versioned, kw_only=True):
    """One producer's cumulative counters since it started (they restart from zero with it)."""

    graded_groups: float = 0.0
    committed_groups: float = 0.0
    skipped_groups: float = 0.0
    """Graded groups not committed (zero variance)."""
    reward_sum: float = 0.0
    reward_count: float = 0.0
    generated_tokens: float = 0.0
    behaviour: dict[str, float] = {}
    """Sums over every graded trajectory: the grader's reward, tokens, turns, tool calls, compactions,
    what the reward shapers added (see ``RolloutManager.behaviour``)."""

    def totals(self) -> dict[str, float]:
        """Every counter by name, the behaviour sums included (what the trainer adds up over producers)."""
        fields = {name: float(getattr(self, name)) for name in
                  ("graded_groups", "committed_groups", "skipped_groups", "reward_sum", "reward_count", "generated_tokens")}
        return {**self.behaviour, **fields}


def write_progress(store: Store, progress: Progress) -> None:
    """Trainer side: replace the progress record."""
    store.put(PROGRESS_KEY, codec.encode(progress))


def read_progress(store: Store) -> Progress:
    """The trainer's last progress record (``Progress()``, step 0, before its first)."""
    try:
        data = store.get(PROGRESS_KEY)
    except ObjectNotFound:
        return Progress()
    return _decode(data, Progress, PROGRESS_KEY)


def write_fleet_counters(store: Store, producer_id: str, counters: FleetCounters) -> None:
    """Producer side: replace this producer's counters."""
    store.put(f"{FLEET_PREFIX}{producer_id}.json", codec.encode(counters))


def read_fleet_counters(store: Store) -> dict[str, FleetCounters]:
    """Trainer side: every producer's last counters, by producer id (a record that cannot be read, or
    vanished while listing, is left out: the next read has it)."""
    counters = {}
    for key in store.list(FLEET_PREFIX):
        try:
            counters[key[len(FLEET_PREFIX):].removesuffix(".json")] = _decode(store.get(key), FleetCounters, key)
        except (ObjectNotFound, WireError):
            continue
    return counters


def _decode(data: bytes, type_: type[Progress] | type[FleetCounters], key: str) -> Progress | FleetCounters:
    if data[:1] == b"{":  # JSON, as relayrl 0.1 wrote it
        try:
            plain = json.loads(data)
        except ValueError as exc:
            raise WireError(f"{key}: not decodable ({exc})") from None
        if type_ is FleetCounters:
            known = set(FleetCounters.__struct_fields__)
            plain = {**{name: value for name, value in plain.items() if name in known},
                     "behaviour": {name: value for name, value in plain.items() if name not in known}}
        return codec.decode(codec.encode(plain), type_, what=key)
    return codec.decode(data, type_, what=key)
