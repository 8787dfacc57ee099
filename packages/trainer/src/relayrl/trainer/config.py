"""The ``[trainer]`` config section."""

from __future__ import annotations

from typing import Literal

from relayrl.core.config import ConfigError, Section
from relayrl.core.errors import PluginError
from relayrl.core.plugins import PluginManager
from relayrl.trainer.hookspecs import TRAINER_BACKENDS

__all__ = ["TrainerSection", "WarmupSection"]


class WarmupSection(Section, kw_only=True):
    """``[trainer.warmup]``: supervised steps on the environment's demonstrations before RL (0: none)."""

    steps: int = 0
    batch_size: int = 128
    lr: float = 3e-3
    ramp: float = 0.1
    """Fraction of the steps over which the learning rate ramps up linearly from 0."""
    decay: str = "none"
    """After the ramp: ``"none"`` (constant) or ``"cosine"`` (down to a tenth of ``lr`` at the last step)."""
    muon: bool = False
    """Muon for the hidden matrices (AdamW for embeddings, norms and the head), as ``[algo.optimizer]``
    splits them: on a fresh model it finds copying skills in far fewer steps than AdamW alone."""
    muon_lr: float | None = None
    """Muon's learning rate (default: ``lr``)."""
    threads: int = 0
    """torch intra-op threads during the warm-up; 0: ``[trainer] threads``. The fleet waits for the
    warmed weights meanwhile, so the warm-up may take every core that RL shares with the engines."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        from relayrl.algo.optim import check_learning_rate

        for key in ("lr", "muon_lr"):
            check_learning_rate(getattr(self, key), f"{path}.{key}")
        if self.decay not in ("none", "cosine"):
            raise ConfigError(f"{path}.decay: must be \"none\" or \"cosine\", got {self.decay!r}")
        if not 0.0 <= self.ramp <= 1.0:
            raise ConfigError(f"{path}.ramp: must be between 0 and 1, got {self.ramp}")
        if self.threads < 0:
            raise ConfigError(f"{path}.threads: must be >= 0 (0: the trainer's)")


class TrainerSection(Section, kw_only=True):
    """``[trainer]``: how the trainer steps (the algorithm itself is ``[algo]``)."""

    backend: str = "torch"
    """Trainer backend (``relayrl_trainer_backends``): ``torch`` built in, ``deepspeed`` as a plugin."""
    micro_batch_tokens: int = 16384
    """Padded tokens per forward/backward; a batch is split into micro-batches of whole sequences."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on the full next-token distribution at trained positions."""
    entropy_metric_tokens: int = 2048
    """Per micro-batch, the ``entropy/token_mean`` metric is estimated on at most this many evenly
    strided target positions (a full-vocabulary softmax at every target cost ~20% of a step); 0: all.
    With an entropy bonus the metric uses every position (the bonus computes it anyway)."""
    threads: int = 0
    """torch intra-op threads for the trainer process; 0 = torch's default."""
    compute_dtype: Literal["", "bfloat16"] = ""
    """Mixed precision (``torch`` backend): ``"bfloat16"`` runs the forward and backward matmuls in
    bfloat16 (``torch.autocast``) while weights, gradients and optimiser state stay in ``model.dtype``
    (float32 master weights: an update far below a bfloat16 ulp is not lost). The loss's softmaxes stay
    in float32. On a CPU with AVX512-BF16 or AMX a step of a 135M model takes about half the time
    (benchmarks/trainer_precision.py, docs/reasoning.md); ``""``: compute in ``model.dtype``. DeepSpeed has its own ``bf16``."""
    steps: int = 0
    """RL optimiser steps of a ``relayrl run``; 0 runs until stopped."""
    checkpoint_every: int = 1
    """Checkpoint after every this many steps (and after the last step, and when the run is stopped).
    A trainer killed between checkpoints resumes from the last one and redoes the steps since on the
    buffer's record of them: the exactly-once ledger keeps the redone step's line (the last line of a
    step wins), and with ``run.deterministic`` the redone steps reproduce the lost ones bit for bit. A
    checkpoint holds the model and its optimiser state (12 bytes a parameter under AdamW: 1.6 GB for a
    135M model), written by a background thread that shares the CPU and the disk with the next steps
    (``checkpoint/write_s``, ``checkpoint/bytes`` in the metrics; docs/fault-tolerance.md)."""
    checkpoint_keep: int = 3
    """Checkpoints kept in ``<run_dir>/checkpoints`` (relayrl-fault-tolerance)."""
    checkpoint_peers: tuple[str, ...] = ()
    """Stores that receive a replica of every checkpoint (``relayrl-peer://host:port/prefix``, ``s3://...``)."""
    ranks: int = 1
    """Data-parallel trainer processes that ``relayrl run`` starts on this machine (rank 0 leads: it
    reads the buffer, publishes, writes metrics). Above 1 the backend must train as one of several
    ranks (``torch``, ``deepspeed``; its registration declares the ``data-parallel`` capability)."""
    elastic: bool = False
    """With ``ranks`` > 1: a rank that dies shrinks the group (the others redo the step on the same
    batch), the launcher restarts it and it rejoins at a step boundary with rank 0's state, instead
    of every rank restarting from the checkpoint. Needs a backend whose ranks each hold the whole
    model (``torch``; its registration declares the ``elastic`` capability). Rank 0 leads and alone
    checkpoints; its death still restarts every rank."""
    warmup: WarmupSection = WarmupSection()

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.entropy_metric_tokens < 0:
            raise ConfigError(f"{path}.entropy_metric_tokens: must be >= 0 (0: every position)")
        if self.micro_batch_tokens <= 0:
            raise ConfigError(f"{path}.micro_batch_tokens: must be > 0")
        if self.steps < 0 or self.warmup.steps < 0:
            raise ConfigError(f"{path}.steps: must be >= 0")
        self.warmup.check(pm, f"{path}.warmup")
        if self.checkpoint_every < 1:
            raise ConfigError(f"{path}.checkpoint_every: must be at least 1 (a checkpoint after every N steps)")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"{path}.checkpoint_keep: must be at least 1")
        if self.ranks < 1:
            raise ConfigError(f"{path}.ranks: must be at least 1")
        if self.compute_dtype and self.backend != "torch":
            raise ConfigError(f"{path}.compute_dtype: the {self.backend!r} backend does not read it "
                              "(DeepSpeed: [deepspeed] bf16 = true); leave it empty")
        try:
            record = TRAINER_BACKENDS.lookup(pm, self.backend)
        except PluginError as exc:
            raise ConfigError(f"{path}.backend: {exc}") from None
        if self.ranks > 1 and "data-parallel" not in record.capabilities:
            raise ConfigError(f"{path}.ranks: backend {self.backend!r} trains in one process; ranks > 1 needs a "
                              f"data-parallel backend (torch, deepspeed)")
        if self.elastic and self.ranks < 2:
            raise ConfigError(f"{path}.elastic: needs ranks > 1 (there is no group to shrink and regrow)")
        if self.elastic and "elastic" not in record.capabilities:
            raise ConfigError(f"{path}.elastic: backend {self.backend!r} cannot change its number of ranks while it "
                              f"trains (its ranks hold shards of one model); use backend = \"torch\" or elastic = false")
