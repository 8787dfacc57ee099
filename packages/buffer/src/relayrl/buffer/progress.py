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
from collections import Counter

from relayrl.core import codec
from relayrl.core.errors import ObjectNotFound, WireError
from relayrl.core.store import Store
from relayrl.core.wire import Versioned

__all__ = ["FLEET_BEHAVIOUR", "FLEET_PREFIX", "PROGRESS_KEY", "FleetCounters", "FleetMetrics", "Progress",
           "read_fleet_counters", "read_progress", "write_fleet_counters", "write_progress"]

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


FLEET_BEHAVIOUR = {
    "reward/fleet_graded_mean": ("graded_reward_sum", "trajectories"),
    "fleet/tokens_per_trajectory": ("generated_tokens", "trajectories"),
    "fleet/shaping_per_trajectory": ("shaping_sum", "trajectories"),
    "fleet/turns_per_trajectory": ("turns", "trajectories"),
    "fleet/tool_calls_per_trajectory": ("tool_calls", "trajectories"),
    "fleet/parallel_turn_share": ("parallel_turns", "turns"),
    "fleet/tool_s_per_call": ("tool_seconds", "tool_results"),
    "fleet/compacted_share": ("compacted_trajectories", "trajectories"),
    "fleet/compactions_per_trajectory": ("compactions", "trajectories"),
}
"""Per-step means over every trajectory graded since the previous step (the rollout manager's
behaviour counters): metric -> (counter, counter it is divided by). ``reward/fleet_graded_mean`` is
the grader's reward before any shaper; ``fleet/shaping_per_trajectory`` is what the shapers added
(the length penalty's mean, negative in its budget phases)."""


class FleetMetrics:
    """The fleet's success rate and behaviour over every group graded between two reads, trained on or not.

    ``reward/mean`` of a step covers only its batch, which the zero-variance filter biases towards
    mixed groups; ``reward/fleet_mean`` here is the policy's actual success rate, the number to judge
    learning by. Between two reads with nothing graded, the last values stand.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._totals: Counter[str] = Counter()
        self._reward: float | None = None
        self._behaviour: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        """The metrics since the previous read (the first read: since the producers started)."""
        totals: Counter[str] = Counter()
        for counters in read_fleet_counters(self.store).values():
            totals.update(counters.totals())
        previous, self._totals = self._totals, totals
        if totals["reward_count"] < previous["reward_count"]:
            previous = Counter()  # a producer restarted: its counters began again from zero
        count = totals["reward_count"] - previous["reward_count"]
        metrics = {"fleet/groups_graded_total": totals["graded_groups"],
                   "fleet/zero_variance_fraction": totals["skipped_groups"] / max(totals["graded_groups"], 1.0)}
        if count > 0:
            self._reward = (totals["reward_sum"] - previous["reward_sum"]) / count
        if self._reward is not None:
            metrics["reward/fleet_mean"] = self._reward
        for name, (numerator, denominator) in FLEET_BEHAVIOUR.items():
            interval = totals[denominator] - previous[denominator]
            if interval > 0:
                self._behaviour[name] = (totals[numerator] - previous[numerator]) / interval
        metrics.update(self._behaviour)
        return metrics


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
