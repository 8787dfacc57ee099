"""The live terminal display of ``relayrl run``: one progress line, alarms and restarts above it.

It reads what the processes write anyway (``metrics.jsonl``, ``status/*.json``, events), so it
costs the run nothing and shows the same numbers as the report. On a terminal the line is redrawn
in place; otherwise (CI logs, ``| tee``) a line is printed every ``every_s`` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from relayrl.cli.run.layout import RunLayout
from relayrl.trainer.metrics import parse_metrics_line

__all__ = ["Display"]


class Display:
    def __init__(self, layout: RunLayout, *, total_steps: int, stream: IO[str] = sys.stdout,
                 interactive: bool | None = None, every_s: float = 10.0) -> None:
        self.layout = layout
        self.total_steps = total_steps
        self.stream = stream
        self.interactive = stream.isatty() if interactive is None else interactive
        self.every_s = every_s
        self.started = time.monotonic()
        self._offset = 0
        self._last: dict[str, Any] = {}
        self._first_step: int | None = None
        self._first_step_time = 0.0
        self._last_draw = 0.0
        self._seen_events: set[str] = set()
        self.recent_rewards: list[float] = []
        # The fleet's counters when this display first saw the current wait: (wait start, when seen, counters).
        self._fleet_at_wait: tuple[float, float, dict[str, Any]] | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_draw < (0.5 if self.interactive else self.every_s):
            return
        self._last_draw = now
        self._read_metrics()
        self._print_events()
        self._draw(self.line())

    def _read_metrics(self) -> None:
        path = self.layout.root / "metrics.jsonl"
        if not path.exists():
            return
        with open(path) as handle:
            handle.seek(self._offset)
            for line in handle:
                if not line.endswith("\n"):
                    break  # being written
                self._offset += len(line.encode())
                record = parse_metrics_line(line)
                if record is None:
                    continue
                self._last = record
                if self._first_step is None:
                    self._first_step, self._first_step_time = record["step"], time.monotonic()
                reward = record["metrics"].get("reward/fleet_mean", record["metrics"].get("reward/mean"))
                if reward is not None:
                    self.recent_rewards = [*self.recent_rewards, reward][-20:]

    def _print_events(self) -> None:
        store = self.layout.checkpoint_store()
        try:
            keys = store.list("events/")
        except Exception:
            return
        from relayrl.core import codec, wire

        for key in keys:
            if key in self._seen_events:
                continue
            self._seen_events.add(key)
            try:
                event = codec.decode(store.get(key), wire.RunEvent, what=key)
            except Exception:
                continue
            if event.kind in ("alarm", "restart", "warmup", "resumed") or event.level in ("warning", "error"):
                self._draw(f"[{event.source}] {event.kind}: {event.message}", keep=True)
                tail = event.data.get("log_tail") if isinstance(event.data, dict) else None
                if tail:  # a child that died: the last lines of its log, not just its exit status
                    self._draw(f"  last lines of {event.data.get('log', 'its log')}:", keep=True)
                    for line in tail:
                        self._draw(f"    {line}", keep=True)

    def line(self) -> str:
        trainer = self.layout.read_status("trainer")
        waiting = self.waiting_reason(trainer)
        if not self._last:
            phase = trainer.get("phase", "starting")
            if phase == "warmup":
                return f"warm-up {trainer.get('step', 0)}/{trainer.get('steps', '?')} loss {trainer.get('loss', 0):.3f}"
            return f"{phase} ({time.monotonic() - self.started:.0f} s)" + (f" | {waiting}" if waiting else "")
        step = int(self._last["step"])
        metrics = self._last["metrics"]
        parts = [f"step {step}" + (f"/{self.total_steps}" if self.total_steps else "")]
        if self.total_steps and self._first_step is not None and step > self._first_step:
            rate = (step - self._first_step) / max(time.monotonic() - self._first_step_time, 1e-6)
            parts.append(f"ETA {_duration((self.total_steps - step) / rate)}")
        if self.recent_rewards:
            parts.append(f"reward {sum(self.recent_rewards) / len(self.recent_rewards):.3f}")
        for label, name, fmt in (("entropy", "entropy/token_mean", ".3f"), ("staleness", "staleness/mean", ".2f"),
                                 ("trainer tok/s", "trainer/tokens_per_s", ".0f"), ("fleet tok/s", "fleet/tokens_per_s", ".0f")):
            if metrics.get(name) is not None:
                parts.append(f"{label} {format(metrics[name], fmt)}")
        if metrics.get("fleet/engine_version_min") is not None:
            parts.append(f"engines at v{metrics['fleet/engine_version_min']:.0f}")
        if metrics.get("eval/pass@1") is not None:
            parts.append(f"eval pass@1 {metrics['eval/pass@1']:.3f} (step {metrics.get('eval/step', 0):.0f})")
        if waiting:
            parts.append(waiting)
        return " | ".join(parts)

    def waiting_reason(self, trainer: dict[str, Any], *, after_s: float = 20.0) -> str:
        """Why the trainer has had no batch for more than ``after_s`` seconds ('' while it trains).

        From what the processes report anyway: the trainer's status while it waits (what the buffer
        dropped meanwhile, how much is pending), the rollout process's status (engine health, the
        fleet's counters).
        """
        since = trainer.get("waiting_since")
        if not isinstance(since, (int, float)):
            self._fleet_at_wait = None
            return ""
        rollout = self.layout.read_status("rollout")
        fleet = rollout.get("metrics", {})
        if self._fleet_at_wait is None or self._fleet_at_wait[0] != since:
            self._fleet_at_wait = (since, time.monotonic(), dict(fleet))
        waited = time.time() - since
        if waited < after_s:
            return ""
        _, seen_at, before = self._fleet_at_wait
        watched = time.monotonic() - seen_at >= after_s / 2  # long enough to say the fleet made nothing
        grown = {name: fleet.get(name, 0.0) - before.get(name, 0.0)
                 for name in ("fleet/groups", "fleet/groups_graded", "fleet/zero_variance_skipped")}
        dropped = {reason: count for reason, count in (trainer.get("dropped_while_waiting") or {}).items() if count}
        engines = rollout.get("engines") or []
        down = [engine.get("engine_id", "?") for engine in engines if not engine.get("alive")]
        if dropped:
            total = sum(dropped.values())
            kinds = ", ".join(f"{reason.replace('_', '-')} {count}" for reason, count in sorted(dropped.items()))
            reason = f"the buffer dropped all {total} groups that arrived ({kinds})"
            if "zero_variance" in dropped:
                reason += ": every sample of a task got the same reward (tasks all solved or all failed?)"
        elif watched and grown["fleet/zero_variance_skipped"] > 0 and grown["fleet/groups"] <= 0:
            reason = (f"the fleet skipped all {grown['fleet/zero_variance_skipped']:.0f} groups it graded as "
                      "zero-variance (every sample of a task got the same reward)")
        elif engines and len(down) == len(engines):
            reason = f"no engine is serving ({', '.join(down)} down)"
        elif engines and all(_weights(engine).get("held_paused") or _weights(engine).get("broken_version") is not None
                             for engine in engines):
            stuck = [f"{engine.get('engine_id', '?')} " + (
                "paused after a failed weight apply" if _weights(engine).get("held_paused") else
                f"cannot verify weight version {_weights(engine)['broken_version']} (asked for a fresh snapshot)")
                for engine in engines]
            reason = "no engine can serve: " + "; ".join(stuck)
        elif not rollout:
            reason = "the rollout process has not reported yet"
        elif watched and grown["fleet/groups_graded"] <= 0:
            reason = "the fleet graded no group" + (f" ({', '.join(down)} down)" if down else "")
        else:
            reason = (f"{trainer.get('pending_groups', 0)}/{trainer.get('batch_groups', '?')} groups for the next "
                      "batch; the fleet is generating")
        return f"waiting {_duration(waited)}: {reason}"

    def _draw(self, text: str, *, keep: bool = False) -> None:
        if self.interactive:
            self.stream.write("\r\x1b[2K" + text + ("\n" if keep else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._last_draw = 0.0
        self._read_metrics()
        self._print_events()
        self._draw(self.line(), keep=True)


def _weights(engine: dict[str, Any]) -> dict[str, Any]:
    """An engine health's weight-update part (``{}`` when it reports none)."""
    value = engine.get("weight_sync")
    return value if isinstance(value, dict) else {}


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
