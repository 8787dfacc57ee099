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

    def line(self) -> str:
        trainer = self.layout.read_status("trainer")
        if not self._last:
            phase = trainer.get("phase", "starting")
            if phase == "warmup":
                return f"warm-up {trainer.get('step', 0)}/{trainer.get('steps', '?')} loss {trainer.get('loss', 0):.3f}"
            return f"{phase} ({time.monotonic() - self.started:.0f} s)"
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
        return " | ".join(parts)

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


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
