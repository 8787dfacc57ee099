"""Retention: delete rollout segments that no restorable checkpoint can need again.

A segment below a producer's watermark in a buffer state is fully resolved for every checkpoint
at least as new as that state. Pass the state of the *oldest* checkpoint that may still be
restored (peer replicas and fallbacks included): a restore from an older checkpoint would need
segments deleted here, and would find its groups missing.

Example::

    deleted = prune_segments(store, oldest_kept_checkpoint["buffer"], prefix=config.buffer.prefix)
"""

from __future__ import annotations

from typing import Any

from relayrl.buffer.cursor import BufferState
from relayrl.buffer.segments import parse_segment_key


def prune_segments(store: Any, state: BufferState | dict[str, Any] | bytes, *, prefix: str = "rollouts") -> int:
    """Delete the segments below each producer's watermark in ``state``; return how many."""
    state = BufferState.coerce(state)
    prefix = prefix.strip("/")
    deleted = 0
    for producer_id, progress in state.producers.items():
        for key in store.list(f"{prefix}/{producer_id}/"):
            parsed = parse_segment_key(prefix, key)
            if parsed is not None and parsed[0] == producer_id and parsed[1] < progress.watermark:
                store.delete(key)
                deleted += 1
    return deleted
