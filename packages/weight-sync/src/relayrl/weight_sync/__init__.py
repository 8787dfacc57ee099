"""relayrl-weight-sync: XOR+zstd weight deltas through object storage, controllers that apply in place.

* :class:`Publisher` (trainer side): every K steps, a delta against the last published version
  (a full snapshot every N), uploaded in the background, committed atomically.
* :class:`Controller` (engine side): poll, prefetch and verify while serving, pause, apply, resume;
  falls back to snapshot + replay on any doubt.
* :class:`EngineAdapter`: what a controller needs from an engine; :class:`StateDictAdapter` implements it
  for a torch module, a state dict or numpy arrays, :class:`ShadowAdapter` for an engine that only
  loads named tensors (a :class:`WeightLoader`, such as vLLM).
* :class:`NodeMirror`: one copy per node on local disk or shared memory for every engine there.
* :mod:`relayrl.weight_sync.codecs`: ``xor-zstd`` and friends; :func:`apply_retention`.
"""

from relayrl.weight_sync.codecs import Codec, make_codec
from relayrl.weight_sync.config import WeightSyncSection
from relayrl.weight_sync.controller import ApplyReport, Controller, Plan, plan_route
from relayrl.weight_sync.engine import EngineAdapter, PausableEngine, ShadowAdapter, StateDictAdapter, WeightLoader
from relayrl.weight_sync.errors import (
    BitMismatch,
    ConcurrentWriter,
    CorruptManifest,
    VersionUnavailable,
    WeightSyncError,
)
from relayrl.weight_sync.layout import WeightBus
from relayrl.weight_sync.mirror import MirrorReport, NodeMirror
from relayrl.weight_sync.publisher import Publisher, PublishReport
from relayrl.weight_sync.retention import apply_retention, needed_versions

__all__ = [
    "ApplyReport", "BitMismatch", "Codec", "ConcurrentWriter", "Controller", "CorruptManifest", "EngineAdapter", "MirrorReport", "NodeMirror",
    "PausableEngine", "Plan", "PublishReport", "Publisher", "ShadowAdapter", "StateDictAdapter", "VersionUnavailable",
    "WeightBus", "WeightLoader", "WeightSyncError",
    "WeightSyncSection", "apply_retention", "make_codec", "needed_versions", "plan_route",
]
