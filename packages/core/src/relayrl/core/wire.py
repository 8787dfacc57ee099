"""Wire schemas: every message that crosses a process or is stored on the bus.

All messages are ``msgspec.Struct(frozen=True, kw_only=True)``. Compatibility rules:

* new fields always get defaults, so older files decode with newer code;
* unknown fields are ignored on decode, so newer files decode with older code where possible;
* top-level messages (those stored as objects) carry ``schema_version``; a reader refuses a file
  whose ``schema_version`` is newer than it understands, with an error naming it.

Token-level data (ids, logprobs, kept-sets) is packed little-endian in ``bytes`` fields (see
:mod:`relayrl.core.arrays`) so a 32k-token trajectory encodes and decodes in microseconds per
thousand tokens and converts to numpy/torch without copying.

The records a generated token carries (design invariant 2): its id, its logprob under the
distribution actually sampled from (after temperature, top-k and top-p truncation and
renormalisation), the policy version that produced it, and its *kept-set*: the token ids the
sampler kept, in CSR form. An empty kept-set row means "not truncated" (the full vocabulary); a
kept-set of size one means the token was forced and contributes no gradient. A mixture-of-experts
policy's span may also carry its :class:`ExpertRouting`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import msgspec

from relayrl.core.arrays import pack_f32, pack_u32, run_length_decode, run_length_encode, unpack_f32, unpack_u32

SCHEMA_VERSION = 1
"""The newest schema version this code writes and reads."""


class Wire(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every wire message."""


class Versioned(Wire, kw_only=True):
    """Base of messages stored as objects: they carry the schema version that wrote them."""

    schema_version: int = SCHEMA_VERSION


# ------------------------------------------------------------------------------ generated tokens
class ExpertRouting(Wire, kw_only=True):
    """The experts each MoE layer routed a run of consecutive token positions to (routing replay, R3).

    Positions count from the first token of the request's prompt, which is also the first token of
    the trajectory segment the request continues: position ``first_generated`` holds the span's
    first generated token. A record covers positions ``[start, start + len(self))``; normally the
    prompt positions not recorded by an earlier span of the segment, then every generated token
    but the last (which the engine never feeds back, and which predicts nothing trained).

    ``experts`` packs ``[positions, layers, top_k]`` expert ids row-major, in the order the router
    ranked them (the gates' order), as uint8 when the model has at most 256 experts (``width`` 1)
    or little-endian uint16 (``width`` 2). A rollout segment is zstd-compressed as a whole, so no
    further compression here. ``format`` versions this layout.
    """

    format: int = 1
    start: int
    first_generated: int
    layers: int
    top_k: int
    width: int = 1
    experts: bytes = b""

    def __post_init__(self) -> None:
        if self.format != 1:
            raise ValueError(f"expert routing format {self.format} is newer than this code reads (1)")
        if self.width not in (1, 2):
            raise ValueError(f"expert ids must be 1 or 2 bytes wide, got {self.width}")
        if self.layers < 1 or self.top_k < 1 or self.start < 0:
            raise ValueError(f"bad routing record: layers={self.layers}, top_k={self.top_k}, start={self.start}")
        if len(self.experts) % (self.layers * self.top_k * self.width):
            raise ValueError(f"{len(self.experts)} bytes of expert ids are not whole positions of "
                             f"{self.layers} layers x top-{self.top_k} x {self.width} bytes")

    def __len__(self) -> int:
        """The number of positions covered."""
        return len(self.experts) // (self.layers * self.top_k * self.width)

    @property
    def end(self) -> int:
        return self.start + len(self)

    @staticmethod
    def concat(parts: Sequence[ExpertRouting]) -> ExpertRouting | None:
        """One record of consecutive ``parts`` (same layout); None when there are none or when they do
        not tile one run of positions (a gap left by a failed request: better no record than a wrong one)."""
        parts = [part for part in parts if len(part)]
        if not parts:
            return None
        first = parts[0]
        layout = (first.layers, first.top_k, first.width, first.first_generated)
        for before, after in itertools.pairwise(parts):
            if after.start != before.end or (after.layers, after.top_k, after.width, after.first_generated) != layout:
                return None
        if len(parts) == 1:
            return first
        return ExpertRouting(start=first.start, first_generated=first.first_generated, layers=first.layers,
                             top_k=first.top_k, width=first.width, experts=b"".join(part.experts for part in parts))


class GeneratedSpan(Wire, kw_only=True):
    """A run of tokens the policy generated in one model call, with everything replay needs.

    Build one with :meth:`build`; read with :meth:`token_ids`, :meth:`token_logprobs`,
    :meth:`token_versions` and :meth:`kept_set`.
    """

    tokens: bytes
    """Token ids, uint32 LE."""
    logprobs: bytes
    """Per-token logprob under the truncated, renormalised distribution sampled from; float32 LE."""
    versions: list[tuple[int, int]]
    """Policy version of each token, run-length encoded as ``(version, count)`` pairs."""
    kept_offsets: bytes = b""
    """CSR row offsets of the kept-sets, uint32 LE, ``len(tokens) + 1`` entries; empty = not recorded."""
    kept_ids: bytes = b""
    """CSR column indices: the kept token ids of every row concatenated, uint32 LE."""
    engine_id: str = ""
    """The engine that generated most of the span (a proxy resume may switch engines mid-span)."""
    finish_reason: str = ""
    """``stop``, ``length``, ``tool_call``, ``abort`` ... as reported by the engine."""
    routing: ExpertRouting | None = None
    """For a mixture-of-experts policy whose engine records it: the experts the engine routed this
    span's positions to, which the trainer forces when ``[algo] routing_replay`` is on."""

    def __post_init__(self) -> None:
        # O(1) checks on every decode; :meth:`check` does the O(n) ones.
        if len(self.tokens) % 4 or len(self.logprobs) % 4 or len(self.kept_offsets) % 4 or len(self.kept_ids) % 4:
            raise ValueError("packed arrays must be a whole number of 4-byte items")
        n = len(self.tokens) // 4
        if len(self.logprobs) != 4 * n:
            raise ValueError(f"{n} tokens but {len(self.logprobs) // 4} logprobs")
        if sum(count for _, count in self.versions) != n:
            raise ValueError(f"{n} tokens but versions cover {sum(count for _, count in self.versions)}")
        if self.kept_offsets:
            if len(self.kept_offsets) != 4 * (n + 1):
                raise ValueError(f"{n} tokens need {n + 1} kept offsets, got {len(self.kept_offsets) // 4}")
            last = int.from_bytes(self.kept_offsets[-4:], "little")
            if last != len(self.kept_ids) // 4:
                raise ValueError(f"last kept offset {last} != number of kept ids {len(self.kept_ids) // 4}")
        elif self.kept_ids:
            raise ValueError("kept ids without kept offsets")
        if self.routing is not None and self.routing.end > self.routing.first_generated + n:
            raise ValueError(f"routing covers positions up to {self.routing.end}, past the span's last token "
                             f"at {self.routing.first_generated + n - 1}")

    @classmethod
    def build(cls, tokens: Sequence[int], logprobs: Sequence[float], versions: int | Sequence[int], *,
              kept: Iterable[Sequence[int]] | None = None,
              kept_csr: tuple[Sequence[int], Sequence[int]] | None = None, **fields: Any) -> GeneratedSpan:
        """Pack plain sequences into a span.

        ``versions`` is one version for every token, or one per token. Kept-sets are given either
        as ``kept`` (one sequence of ids per token) or as ``kept_csr=(offsets, ids)``; neither
        records none.
        """
        n = len(tokens)
        runs = [] if n == 0 else [(versions, n)] if isinstance(versions, int) else run_length_encode(versions)
        offsets_bytes = ids_bytes = b""
        if kept is not None:
            offsets, ids = [0], []
            for row in kept:
                ids.extend(row)
                offsets.append(len(ids))
            kept_csr = (offsets, ids)
        if kept_csr is not None:
            offsets_bytes, ids_bytes = pack_u32(kept_csr[0]), pack_u32(kept_csr[1])
        return cls(tokens=pack_u32(tokens), logprobs=pack_f32(logprobs), versions=runs,
                   kept_offsets=offsets_bytes, kept_ids=ids_bytes, **fields)

    def __len__(self) -> int:
        return len(self.tokens) // 4

    def token_ids(self) -> Any:
        """Token ids as an ``array('I')``."""
        return unpack_u32(self.tokens)

    def token_logprobs(self) -> Any:
        """Behaviour logprobs as an ``array('f')``."""
        return unpack_f32(self.logprobs)

    def token_versions(self) -> list[int]:
        """The policy version of every token (expanded from the run-length encoding)."""
        return run_length_decode(self.versions)

    @property
    def has_kept_sets(self) -> bool:
        return bool(self.kept_offsets)

    def kept_csr(self) -> tuple[Any, Any]:
        """``(offsets, ids)`` arrays of the kept-sets (both empty when none were recorded)."""
        return unpack_u32(self.kept_offsets), unpack_u32(self.kept_ids)

    def kept_set(self, index: int) -> list[int]:
        """Kept token ids of token ``index`` (``[]`` = untruncated, full vocabulary)."""
        if not self.kept_offsets:
            return []
        if not 0 <= index < len(self):
            raise IndexError(f"token index {index} out of range for a span of {len(self)} tokens")
        start = int.from_bytes(self.kept_offsets[4 * index:4 * index + 4], "little")
        end = int.from_bytes(self.kept_offsets[4 * index + 4:4 * index + 8], "little")
        return list(unpack_u32(self.kept_ids[4 * start:4 * end]))

    def check(self) -> None:
        """Full O(n) validation: offsets non-decreasing, each sampled token inside its kept-set."""
        if not self.kept_offsets:
            return
        offsets, ids = self.kept_csr()
        tokens = self.token_ids()
        for i in range(len(tokens)):
            start, end = offsets[i], offsets[i + 1]
            if end < start:
                raise ValueError(f"kept offsets decrease at token {i}")
            if end > start and tokens[i] not in ids[start:end]:
                raise ValueError(f"token {i} (id {tokens[i]}) is not in its own kept-set")


# ------------------------------------------------------------------------------ turns
class ToolCall(Wire, kw_only=True):
    """One tool call the model made."""

    id: str
    name: str
    arguments: dict[str, Any] = {}


class ToolResult(Wire, kw_only=True):
    """The outcome of one tool call, returned to the model in call order."""

    call_id: str
    output: str = ""
    exit_status: int = 0
    wall_time_s: float = 0.0
    truncated: bool = False
    error: str | None = None
    """Set when the call could not run (malformed arguments, unknown tool, sandbox failure)."""


Role = Literal["system", "user", "assistant", "tool"]


class Turn(Wire, kw_only=True):
    """One message of the conversation, as tokens the model saw and (for assistant) produced."""

    role: Role
    tokens: bytes = b""
    """Context tokens of this message (chat-template rendered), uint32 LE; never trained on."""
    generated: GeneratedSpan | None = None
    """The assistant's generated tokens (trained on); None for other roles."""
    text: str = ""
    tool_calls: list[ToolCall] = []
    tool_results: list[ToolResult] = []

    def context_token_ids(self) -> Any:
        return unpack_u32(self.tokens)

    @property
    def num_context_tokens(self) -> int:
        """How many context tokens :attr:`tokens` packs (without unpacking them)."""
        return len(self.tokens) // 4

    @property
    def num_tokens(self) -> int:
        """Context plus generated tokens: what the trainer processes for this message."""
        return self.num_context_tokens + (len(self.generated) if self.generated is not None else 0)


class TrajectorySegment(Wire, kw_only=True):
    """One context window of a trajectory; self-compaction starts a new segment."""

    turns: list[Turn]
    reason: Literal["start", "compaction"] = "start"
    """``start`` for the first segment; ``compaction`` for one that begins from a summary."""
    summary: str = ""
    """For a compaction segment: the model's own summary of its working state it starts from."""

    def generated_spans(self) -> list[GeneratedSpan]:
        return [turn.generated for turn in self.turns if turn.generated is not None]


# ------------------------------------------------------------------------------ trajectories
class CheatingFlag(Wire, kw_only=True):
    """An exploit detector's finding; any flag makes the trajectory's reward 0."""

    detector: str
    evidence: str
    segment: int | None = None
    turn: int | None = None


class Timings(Wire, kw_only=True):
    """Wall-clock accounting of one trajectory (seconds; ``*_at`` are Unix times)."""

    started_at: float = 0.0
    finished_at: float = 0.0
    generation_s: float = 0.0
    tool_s: float = 0.0
    grading_s: float = 0.0


class Trajectory(Versioned, kw_only=True):
    """One agent attempt at a task: its context segments, reward, flags and costs."""

    trajectory_id: str
    task_id: str
    group_id: str
    sample_index: int
    segments: list[TrajectorySegment]
    reward: float = 0.0
    reward_components: dict[str, float] = {}
    """Named parts of the reward (``success``, ``length_penalty`` ...); ``reward`` is final."""
    cheating: list[CheatingFlag] = []
    timings: Timings = Timings()
    engine_ids: list[str] = []
    status: str = "ok"
    """``ok``, ``budget_exhausted``, ``error`` ..."""
    error: str | None = None
    metrics: dict[str, float] = {}

    def generated_spans(self) -> list[GeneratedSpan]:
        return [span for segment in self.segments for span in segment.generated_spans()]

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(span) for span in self.generated_spans())

    @property
    def num_turns(self) -> int:
        return sum(1 for segment in self.segments for turn in segment.turns if turn.role == "assistant")

    @property
    def tool_seconds(self) -> float:
        return sum(result.wall_time_s for segment in self.segments for turn in segment.turns
                   for result in turn.tool_results)

    def policy_version_range(self) -> tuple[int, int] | None:
        """(oldest, newest) policy version among generated tokens, or None if none were generated."""
        versions = [version for span in self.generated_spans() for version, _ in span.versions]
        return (min(versions), max(versions)) if versions else None


class Group(Versioned, kw_only=True):
    """All G samples of one prompt: the unit of advantage estimation and of batching."""

    group_id: str
    task_id: str
    trajectories: list[Trajectory]
    created_at: float = 0.0
    metadata: dict[str, str] = {}

    @property
    def rewards(self) -> list[float]:
        return [trajectory.reward for trajectory in self.trajectories]


class RolloutSegment(Versioned, kw_only=True):
    """A batch of scored groups committed to the bus by one producer (``rollouts/`` objects)."""

    producer_id: str
    sequence: int
    groups: list[Group]
    created_at: float = 0.0


# ------------------------------------------------------------------------------ tasks
class TaskSpec(Versioned, kw_only=True):
    """A task: what the agent is asked, where its workspace comes from, and how it is graded."""

    task_id: str
    instruction: str
    kind: str = "code"
    """The environment/harness that interprets the task (``code``, ``answer``, ``code-search`` ...)."""
    workspace: str = ""
    """Directory, tarball or git repository the agent's workspace is prepared from."""
    hidden_tests: str = ""
    """Tests the grader alone holds; never copied into the agent's workspace."""
    grading_command: str = ""
    gold_patch: str | None = None
    reference_globs: list[str] = []
    """Extra globs of reference artifacts to strip from the workspace."""
    answer: Any = None
    """Ground truth for tasks graded without a sandbox command (answers, file sets)."""
    metadata: dict[str, Any] = {}


# ------------------------------------------------------------------------------ weights
class TensorEntry(Wire, kw_only=True):
    """Where one tensor of a weight version lives and how to rebuild its exact bits."""

    name: str
    dtype: str
    shape: list[int]
    object_key: str
    offset: int
    length: int
    codec: str
    """``raw`` for full tensors; a delta codec name (``xor-zstd`` ...) for deltas."""
    checksum: str
    """Checksum of the resulting tensor bits (after applying a delta), hex."""


class WeightManifest(Versioned, kw_only=True):
    """One published weight version; written last and atomically, so a visible manifest is complete."""

    version: int
    parent: int | None = None
    """For a delta: the exact version it applies onto. None for a full snapshot."""
    kind: Literal["full", "delta"]
    tensors: list[TensorEntry]
    snapshot: int | None = None
    """The full snapshot this version's delta chain starts from."""
    step: int = 0
    """Trainer optimiser step that produced the weights."""
    created_at: float = 0.0
    metadata: dict[str, str] = {}


# ------------------------------------------------------------------------------ events
class RunEvent(Versioned, kw_only=True):
    """Something that happened in a run: started, weights applied, alarm, restart ..."""

    time: float
    source: str
    kind: str
    level: Literal["debug", "info", "warning", "error"] = "info"
    message: str = ""
    data: dict[str, Any] = {}
