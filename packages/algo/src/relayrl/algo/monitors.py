"""Health monitors: metric series and behavioural phrase ratios, with drift alarms.

A long RL run rarely collapses without warning. The signals that came first in published runs:
policy entropy sliding towards zero, the train/inference mismatch KL climbing, clip fractions
jumping, response lengths exploding, and, from the Kevin-32B work, the *"not okay" ratio*: the base
model opened its chain of thought with "Okay", and as training destabilised the openings turned
desperate ("okay okay I mean", "okay, holy crap ..."). Monitors watch such series every trainer
step and raise an :class:`Alarm` when one drifts.

The alarm rule is an EWMA z-score: with exponentially weighted mean ``m`` and variance ``v`` of the
past values (rate ``alpha``), a new value ``x`` alarms when ``|x - m| / sqrt(v + eps) > threshold``
after ``warmup`` observations, in the watched direction. It adapts to slow trends and fires on
sudden moves, which is what precedes a collapse.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from relayrl.core.config import Section
from relayrl.core.wire import Trajectory

if TYPE_CHECKING:
    from relayrl.algo.hookspecs import Monitor

__all__ = [
    "DEFAULT_PHRASES",
    "Alarm",
    "EWMAAlarm",
    "MonitorSet",
    "PhraseMonitor",
    "SeriesMonitor",
    "behaviour_metrics",
]

Direction = Literal["up", "down", "both"]

DEFAULT_PHRASES = {
    # A chain of thought that opens with repeated or desperate "okay" phrasing.
    "not_okay": r"^\W*okay\b[\s,.!:;-]*(?:okay|ok|i mean|holy|wait|hmm+|oh no|ugh|damn|crap|shit|no no)\b",
}


@dataclasses.dataclass(frozen=True)
class Alarm:
    monitor: str
    metric: str
    step: int
    value: float
    expected: float
    z_score: float
    message: str


class AlarmSection(Section, kw_only=True):
    alpha: float = 0.1
    """EWMA rate: weight of the newest value in the running mean and variance."""
    threshold: float = 4.0
    """|z| above which a value alarms."""
    warmup: int = 20
    """Observations before any alarm."""
    min_std: float = 1e-3
    """Floor on the std, so a perfectly flat series does not alarm on noise."""
    min_relative_change: float = 0.1
    """An alarm also needs the value to differ from the expected one by this fraction of it: a very
    steady series (response length of a converged policy) otherwise alarms on a 5% wobble."""


class EWMAAlarm:
    """EWMA mean/variance of a series and the z-score rule; checkpointable via ``state``."""

    def __init__(self, config: AlarmSection | None = None, direction: Direction = "both") -> None:
        self.config = config or AlarmSection()
        self.direction = direction
        self.count = 0
        self.mean = 0.0
        self.variance = 0.0

    def update(self, value: float) -> tuple[bool, float, float]:
        """Feed one value; return (alarm, z-score against the past, the expected value)."""
        if not math.isfinite(value):
            return True, math.inf, self.mean
        expected = self.mean
        std = max(math.sqrt(self.variance), self.config.min_std)
        z = (value - expected) / std if self.count else 0.0
        material = abs(value - expected) >= self.config.min_relative_change * abs(expected)
        fired = self.count >= self.config.warmup and material and (
            (self.direction in ("up", "both") and z > self.config.threshold)
            or (self.direction in ("down", "both") and z < -self.config.threshold))
        if self.count == 0:
            self.mean = value
        else:
            alpha = self.config.alpha
            delta = value - self.mean
            self.mean += alpha * delta
            self.variance = (1 - alpha) * (self.variance + alpha * delta * delta)
        self.count += 1
        return fired, z, expected

    def state(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "variance": self.variance}

    def restore(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.variance = int(state["count"]), float(state["mean"]), float(state["variance"])


class SeriesMonitor:
    """Watches one metric (e.g. ``entropy/token_mean``) for drift in a direction."""

    def __init__(self, name: str, metric: str, direction: Direction, alarm: AlarmSection | None = None) -> None:
        self.name = name
        self.metric = metric
        self.rule = EWMAAlarm(alarm, direction)

    def observe(self, step: int, metrics: dict[str, float], texts: Sequence[str] = ()) -> tuple[dict[str, float], list[Alarm]]:
        if self.metric not in metrics:
            return {}, []
        value = float(metrics[self.metric])
        fired, z, expected = self.rule.update(value)
        alarms = [Alarm(self.name, self.metric, step, value, expected, z,
                        f"{self.metric} = {value:.4g} at step {step}, expected about {expected:.4g} (z = {z:+.1f})")
                  ] if fired else []
        return {}, alarms

    def state(self) -> dict[str, object]:
        return {"rule": self.rule.state()}

    def restore(self, state: dict[str, object]) -> None:
        self.rule.restore(state["rule"])  # type: ignore[arg-type]


class PhraseMonitor:
    """Ratio of texts matching each regular expression, per step, with an alarm when it rises.

    ``texts`` are decoded model outputs of the step (by default the first assistant turn of each
    trajectory). Reported as ``phrase/<name>``.
    """

    def __init__(self, name: str = "phrases", patterns: dict[str, str] | None = None,
                 alarm: AlarmSection | None = None) -> None:
        self.name = name
        self.patterns = {key: re.compile(value, re.IGNORECASE) for key, value in (patterns or DEFAULT_PHRASES).items()}
        self.rules = {key: EWMAAlarm(alarm, "up") for key in self.patterns}

    def ratios(self, texts: Sequence[str]) -> dict[str, float]:
        if not texts:
            return {}
        return {f"phrase/{key}": sum(1 for text in texts if pattern.search(text)) / len(texts)
                for key, pattern in self.patterns.items()}

    def observe(self, step: int, metrics: dict[str, float], texts: Sequence[str] = ()) -> tuple[dict[str, float], list[Alarm]]:
        ratios = self.ratios(texts)
        alarms = []
        for key, rule in self.rules.items():
            metric = f"phrase/{key}"
            if metric not in ratios:
                continue
            fired, z, expected = rule.update(ratios[metric])
            if fired:
                alarms.append(Alarm(self.name, metric, step, ratios[metric], expected, z,
                                    f"{metric} rose to {ratios[metric]:.3f} at step {step} (expected {expected:.3f})"))
        return ratios, alarms

    def state(self) -> dict[str, object]:
        return {key: rule.state() for key, rule in self.rules.items()}

    def restore(self, state: dict[str, object]) -> None:
        for key, rule in self.rules.items():
            if key in state:
                rule.restore(state[key])  # type: ignore[arg-type]


class MonitorSet:
    """Runs several monitors on each step's metrics and texts; returns new metrics and alarms (itself a
    :class:`~relayrl.algo.hookspecs.Monitor`)."""

    name = "monitors"

    def __init__(self, monitors: Iterable[Monitor]) -> None:
        self.monitors = list(monitors)

    def observe(self, step: int, metrics: dict[str, float], texts: Sequence[str] = ()) -> tuple[dict[str, float], list[Alarm]]:
        combined = dict(metrics)
        added: dict[str, float] = {}
        alarms: list[Alarm] = []
        # Phrase monitors first: their ratios are metrics that series monitors may watch.
        for monitor in sorted(self.monitors, key=lambda item: not isinstance(item, PhraseMonitor)):
            new_metrics, new_alarms = monitor.observe(step, combined, texts)
            combined.update(new_metrics)
            added.update(new_metrics)
            alarms += new_alarms
        return added, alarms

    def state(self) -> dict[str, object]:
        return {f"{index}:{monitor.name}": monitor.state() for index, monitor in enumerate(self.monitors)}

    def restore(self, state: dict[str, object]) -> None:
        for index, monitor in enumerate(self.monitors):
            key = f"{index}:{monitor.name}"
            if key in state:
                monitor.restore(state[key])  # type: ignore[arg-type]


def behaviour_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Response length, turns and tool calls per turn over a batch of trajectories."""
    if not trajectories:
        return {}
    turns = [trajectory.num_turns for trajectory in trajectories]
    calls = [len(turn.tool_calls) for trajectory in trajectories for segment in trajectory.segments
             for turn in segment.turns if turn.role == "assistant"]
    lengths = [trajectory.num_generated_tokens for trajectory in trajectories]
    return {
        "response/tokens_mean": sum(lengths) / len(lengths),
        "response/tokens_max": float(max(lengths)),
        "response/turns_mean": sum(turns) / len(turns),
        "response/tool_calls_per_turn": sum(calls) / len(calls) if calls else 0.0,
        "response/segments_mean": sum(len(trajectory.segments) for trajectory in trajectories) / len(trajectories),
    }
