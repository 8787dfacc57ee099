"""The ``[weight_sync]`` config section."""

from __future__ import annotations

from typing import Literal

from relayrl.core.config import Section


class WeightSyncSection(Section):
    """``[weight_sync]``: how the trainer publishes weights and how engines pick them up."""

    prefix: str = "weights"
    """Key prefix of weight versions inside the run's store (manifests, objects, ``latest``)."""
    publish_every_steps: int = 1
    """K: publish a version every K optimiser steps (and after the run's last step, so its final weights are on the bus)."""
    snapshot_every_versions: int = 50
    """N: every N-th version is a full snapshot, the others are deltas against the previous version."""
    delta_codec: str = "xor-sparse-zstd"
    """Codec of delta versions (``relayrl_weight_sync_codecs``). ``xor-sparse-zstd`` measured smallest and
    fastest to decode at lr 1e-7..1e-5 (benchmarks/weight_sync/compression.py; see docs/weight-sync.md)."""
    full_codec: str = "zstd"
    """Codec of snapshots: ``zstd``, ``planes-zstd`` or ``raw`` (no compression, cheapest CPU)."""
    zstd_level: int = 1
    """zstd level; 1 was the fastest level with the best ratio on XOR deltas here (3 is slower, same size)."""
    chunk_mib: int = 4
    """Chunk size in MiB: the unit of parallel (de)compression and of the raw/zero fallbacks."""
    min_gain: float = 0.01
    """A chunk is stored raw when zstd shrinks it by less than this fraction."""
    threads: int = 0
    """Threads for encoding, decoding and checksums; 0 means every CPU this process may use."""
    object_mib: int = 256
    """Tensors are packed into objects of about this size; bigger tensors get an object each."""
    upload_threads: int = 4
    """Objects uploaded (and downloaded) in parallel."""
    keep_versions: int = 4
    """Retention keeps this many newest versions plus every base they need; 0 disables retention."""
    keep_every: int = 0
    """Retention also keeps version 1 (the model RL starts from) and every ``keep_every``-th version
    after it (1, 1 + N, 1 + 2N, ...), with their bases, for evaluating them later
    (``relayrl eval RUN_DIR@VERSION``); 0: only the newest."""
    poll_interval_s: float = 1.0
    """How often a controller looks for a newer version."""
    stage_url: str = ""
    """Node-local mirror (``file:///dev/shm/run``) that one controller per node fills for its engines."""
    apply_mode: Literal["copy", "xor"] = "copy"
    """``copy``: stage the new bits and copy them in during the pause; ``xor``: XOR the difference in place."""
    verify_after_apply: bool = True
    """Checksum every tensor of the engine after applying (while paused); a mismatch re-applies or fails."""
    reset_caches_on_apply: bool = True
    """Ask the engine to drop prefix/KV caches after an update: cached keys and values were computed
    with the old weights, so a new request reusing them would not sample from the new policy alone
    (in-flight requests continue either way)."""
