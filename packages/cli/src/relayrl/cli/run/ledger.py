"""The trainer's ledger of consumed groups, and the exactly-once check of a whole run.

Every trainer step appends one line to ``<run_dir>/ledger.jsonl``: the groups it trained on and the
groups resolved as dropped since the previous step (with the policy's reason). A step replayed after
a crash (the trainer died before that step's checkpoint was durable) writes its line again; the
last line of a step wins, exactly as the checkpoint it resumed from dictates.

:func:`verify_run` checks a run from what it left behind: the groups committed on the bus, the
ledger, and the buffer cursor of the newest complete checkpoint. Every group the cursor counts as
resolved must appear in the ledger exactly once, trained or dropped with a reason; no group may be
trained twice or both trained and dropped; nothing in the ledger may be missing from the bus; no
segment may vanish from the bus before it was resolved (a gap in a producer's sequence numbers).
Groups committed after the trainer's last step are still pending: counted, not an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["LedgerWriter", "RunCheck", "read_ledger", "verify_run"]


class LedgerWriter:
    """Appends one line per step to ``<run_dir>/ledger.jsonl`` (line-buffered, so a kill keeps complete lines)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / "ledger.jsonl"
        torn = self.path.exists() and self.path.stat().st_size > 0 and not self.path.read_bytes().endswith(b"\n")
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the writer
        if torn:
            self._file.write("\n")

    def write(self, step: int, trained: list[str], dropped: list[tuple[str, str]]) -> None:
        self._file.write(json.dumps({"step": step, "trained": trained, "dropped": dropped}) + "\n")

    def close(self) -> None:
        self._file.close()


def read_ledger(run_dir: str | os.PathLike[str], *, up_to_step: int | None = None,
                malformed: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """Step -> its last record (steps above ``up_to_step`` left out: they were never checkpointed).

    A line that is not a ledger record (valid JSON of another shape: ``{"step": "x"}``, ``[]``) is
    skipped and its line number appended to ``malformed``; a line cut short by a kill (not JSON) is
    skipped silently, as the writer leaves it."""
    path = Path(run_dir) / "ledger.jsonl"
    records: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if not _is_record(record):
            if malformed is not None and line.strip():
                malformed.append(number)
            continue
        if up_to_step is None or record["step"] <= up_to_step:
            records[int(record["step"])] = record
    return records


def _is_record(record: Any) -> bool:
    """Whether ``record`` has the shape :meth:`LedgerWriter.write` gives a line."""
    return (isinstance(record, dict) and type(record.get("step")) is int
            and isinstance(record.get("trained"), list) and all(isinstance(ref, str) for ref in record["trained"])
            and isinstance(record.get("dropped"), list)
            and all(isinstance(item, list) and len(item) == 2 and all(isinstance(part, str) for part in item)
                    for item in record["dropped"]))


@dataclasses.dataclass
class RunCheck:
    committed: int
    trained: int
    dropped: dict[str, int]
    pending: int
    """Committed but not yet resolved when the run ended."""
    final_step: int
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


def verify_run(run_dir: str | os.PathLike[str]) -> RunCheck:
    """Check exactly-once consumption of a finished or stopped run (see the module docstring)."""
    from relayrl.buffer.cursor import BufferState, Cursor
    from relayrl.buffer.segments import GroupRef, parse_segment_key
    from relayrl.cli.run.layout import RunLayout
    from relayrl.core import codec, wire
    from relayrl.fault_tolerance.checkpoint import CheckpointStore
    from relayrl.fault_tolerance.recovery import recover

    layout = RunLayout(run_dir)
    config = layout.load_config()
    bus = layout.bus(config)
    prefix = config.buffer.prefix.strip("/")
    committed: set[str] = set()
    sequences: dict[str, set[int]] = {}
    for key in bus.list(f"{prefix}/"):
        parsed = parse_segment_key(prefix, key)
        if parsed is None:
            continue
        sequences.setdefault(parsed[0], set()).add(parsed[1])
        segment = codec.decode_compressed(bus.get(key), wire.RolloutSegment, what=key)
        committed.update(str(GroupRef(parsed[0], parsed[1], index)) for index in range(len(segment.groups)))

    recovered = recover(CheckpointStore(layout.checkpoint_store()))
    errors: list[str] = []
    if recovered is None:
        return RunCheck(len(committed), 0, {}, len(committed), 0, ["no complete checkpoint"])
    final_step = int(recovered.state["step"])
    cursor = Cursor.from_state(BufferState.coerce(recovered.state["buffer"]))
    resolved = {ref for ref in committed if cursor.is_resolved(_parse(ref, GroupRef))}
    # A producer numbers its segments 0, 1, 2 ...: a number missing below its newest is a segment that
    # vanished from the bus. Retention deletes only resolved ones; an unresolved one was lost.
    for producer, present in sorted(sequences.items()):
        lost = [sequence for sequence in range(max(present)) if sequence not in present
                and not cursor.segment_done(producer, sequence)]
        if lost:
            errors.append(f"producer {producer}: {len(lost)} segment(s) missing from the bus before being "
                          f"trained or dropped (sequence {', '.join(map(str, lost[:5]))})")

    seen: dict[str, str] = {}
    dropped: dict[str, int] = {}
    malformed: list[int] = []
    records = read_ledger(run_dir, up_to_step=final_step, malformed=malformed)
    if malformed:
        errors.append(f"ledger.jsonl: {len(malformed)} line(s) are not ledger records (line "
                      f"{', '.join(map(str, malformed[:5]))})")
    for step, record in sorted(records.items()):
        entries = [(ref, "trained") for ref in record["trained"]] + [(ref, f"dropped:{why}") for ref, why in record["dropped"]]
        for ref, outcome in entries:
            if ref in seen:
                errors.append(f"group {ref} consumed twice ({seen[ref]}, then {outcome} at step {step})")
            seen[ref] = f"{outcome} at step {step}"
            if ref not in committed:
                errors.append(f"group {ref} in the ledger is not on the bus")
            if outcome.startswith("dropped:"):
                reason = outcome.removeprefix("dropped:")
                if not reason:
                    errors.append(f"group {ref} dropped without a reason")
                dropped[reason] = dropped.get(reason, 0) + 1
    missing = sorted(resolved - set(seen))
    if missing:
        errors.append(f"{len(missing)} resolved groups are missing from the ledger, e.g. {missing[:3]}")
    unresolved_in_ledger = sorted(set(seen) - resolved)
    if unresolved_in_ledger:
        errors.append(f"{len(unresolved_in_ledger)} ledger groups are not resolved by the final cursor, "
                      f"e.g. {unresolved_in_ledger[:3]}")
    trained = sum(1 for outcome in seen.values() if outcome.startswith("trained"))
    return RunCheck(committed=len(committed), trained=trained, dropped=dropped, pending=len(committed - resolved),
                    final_step=final_step, errors=errors)


def _parse(text: str, ref_type: Any) -> Any:
    producer, sequence, index = text.rsplit("/", 2)
    return ref_type(producer, int(sequence), int(index))
