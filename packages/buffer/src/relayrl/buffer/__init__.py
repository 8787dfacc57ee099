"""relayrl-buffer: the seam between the rollout fleet and the trainer.

* :mod:`relayrl.buffer.segments`: segment names and :class:`SegmentWriter` (producer side);
* :mod:`relayrl.buffer.buffer`: :class:`Buffer` (trainer side): ingest, admission, batches;
* :mod:`relayrl.buffer.admission`: admission policies (staleness, zero variance) and their registry;
* :mod:`relayrl.buffer.cursor`: :class:`BufferState`, the exactly-once cursor;
* :mod:`relayrl.buffer.restart`: re-balancing the backlog after a restart;
* :mod:`relayrl.buffer.retention`: deleting segments no restorable checkpoint needs;
* :mod:`relayrl.buffer.prompts`: :class:`PromptScheduler` and its registry;
* :mod:`relayrl.buffer.config`: the ``[buffer]`` config section;
* :mod:`relayrl.buffer.testing`: realistic test groups and the conformance suites.
"""

from relayrl.buffer.admission import Admission, AdmissionChain, StalenessPolicy, ZeroVariancePolicy
from relayrl.buffer.batch import Batch, BatchGroup, BatchMetrics, DroppedGroup
from relayrl.buffer.buffer import Buffer
from relayrl.buffer.config import BufferSection, PromptsSection, RestartSection, StalenessSection
from relayrl.buffer.cursor import BufferState
from relayrl.buffer.groups import PendingGroup
from relayrl.buffer.progress import (
    FleetCounters,
    FleetMetrics,
    Progress,
    read_fleet_counters,
    read_progress,
    write_fleet_counters,
    write_progress,
)
from relayrl.buffer.prompts import (
    Pick,
    PromptScheduler,
    PromptSchedulerState,
    create_prompt_scheduler,
)
from relayrl.buffer.retention import prune_segments
from relayrl.buffer.segments import GroupRef, SegmentConflict, SegmentWriter, parse_segment_key, segment_key

__all__ = [
    "Admission",
    "AdmissionChain",
    "Batch",
    "BatchGroup",
    "BatchMetrics",
    "Buffer",
    "BufferSection",
    "BufferState",
    "DroppedGroup",
    "FleetCounters",
    "FleetMetrics",
    "GroupRef",
    "PendingGroup",
    "Pick",
    "Progress",
    "PromptScheduler",
    "PromptSchedulerState",
    "PromptsSection",
    "RestartSection",
    "SegmentConflict",
    "SegmentWriter",
    "StalenessPolicy",
    "StalenessSection",
    "ZeroVariancePolicy",
    "create_prompt_scheduler",
    "parse_segment_key",
    "prune_segments",
    "read_fleet_counters",
    "read_progress",
    "segment_key",
    "write_fleet_counters",
    "write_progress",
]
