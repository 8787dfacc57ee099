"""The DeepSpeed ZeRO trainer backend.

Every rank builds the same :class:`relayrl.trainer.batch.SequenceBatch` from the same groups (the
buffer hands every rank the whole batch), computes advantages and the global denominator on the
whole of it, splits it into token-budget micro-batches, and processes micro-batches ``rank,
rank + world, ...``. Each rank runs the same number of forward/backward passes (a rank short of
micro-batches repeats one with zero weight), because ZeRO-3 gathers parameters collectively in
every forward. DeepSpeed averages gradients over ranks, so each rank's loss is scaled by the world
size: the sum over ranks of ``loss_part / global_denominator`` is then exactly the single-process
loss, and the gradients match the torch backend on the same batch.

Gradient accumulation is relayrl's: ``gradient_accumulation_steps = 1`` in DeepSpeed's config, the
accumulation boundary set by hand on each rank's last micro-batch, losses already normalised by the
global denominator (no ``1/gas`` scaling).
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from relayrl.algo.config import AlgoSection
from relayrl.algo.optim import partition_parameters
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import Group
from relayrl.trainer.batch import split_by_token_budget
from relayrl.trainer.config import TrainerSection
from relayrl.trainer.distributed import all_reduce_metric_sums
from relayrl.trainer.objective import BatchObjective
from relayrl_deepspeed.config import DeepSpeedSection

__all__ = ["DeepSpeedTrainer", "deepspeed_config"]


def deepspeed_config(algo: AlgoSection, trainer: TrainerSection, ds: DeepSpeedSection, *, use_muon: bool
                     ) -> dict[str, Any]:
    """The DeepSpeed JSON config these sections describe."""
    optimizer = algo.optimizer
    # torch_adam: DeepSpeed's fused Adam would JIT-compile a C++ op (~1 min per environment) for no
    # gain here; torch's AdamW also keeps its step count in its state (FusedAdam recomputes beta^t from a
    # running product, which a restored checkpoint does not reproduce bit for bit).
    if use_muon:  # the Adam half (embeddings, norms, biases) is torch's AdamW too
        optimizer_config = {"type": "Muon", "params": {
            "lr": optimizer.lr, "muon_lr": optimizer.muon_lr if optimizer.muon_lr is not None else optimizer.lr,
            "adam_lr": optimizer.lr, "momentum": optimizer.muon_momentum, "weight_decay": optimizer.weight_decay,
            "betas": list(optimizer.betas), "eps": optimizer.eps, "torch_adam": True}}
    else:
        optimizer_config = {"type": "AdamW", "params": {
            "lr": optimizer.lr, "betas": list(optimizer.betas), "eps": optimizer.eps,
            "weight_decay": optimizer.weight_decay, "torch_adam": True}}
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if use_muon and ds.zero_stage == 3:
        zero["reduce_scatter"] = False  # DeepSpeed's ZeRO-3 Muon needs whole gradients to orthogonalise
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": trainer.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.bf16},
        "optimizer": optimizer_config,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def _skip_shared_memory_op(ds_lib: Any) -> None:
    """Tell DeepSpeed not to JIT-build its CPU shared-memory collective (~45 s per environment).

    Its communication backend builds the op when it starts on a CPU, but only ``inference_all_reduce``
    uses it; training's collectives go through the process group (gloo here) either way.
    """
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            ds_lib.ops.__compatible_ops__[builder.NAME] = False
    except Exception:  # another DeepSpeed layout: it builds the op, as before
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DeepSpeedTrainer:
    """Trainer backend ``deepspeed`` (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, *, algo: AlgoSection | None = None, config: TrainerSection | None = None,
                 version: int = 0, deepspeed: DeepSpeedSection | None = None, pm: PluginManager | None = None) -> None:
        import deepspeed as ds_lib

        self.algo = algo or AlgoSection()
        self.config = config or TrainerSection()
        self.ds_section = deepspeed or DeepSpeedSection()
        self.version = version
        if not dist.is_initialized():
            backend = self.ds_section.dist_backend
            if backend == "auto":
                backend = "nccl" if torch.cuda.is_available() else "gloo"
            if "WORLD_SIZE" not in os.environ:
                # One process not started by torchrun or the deepspeed launcher (relayrl run's trainer):
                # a world of one on loopback, instead of DeepSpeed's MPI discovery.
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(_free_port()))
                os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
            if backend == "gloo":
                _skip_shared_memory_op(ds_lib)
            ds_lib.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        muon, adamw = partition_parameters(model, self.algo.optimizer)
        use_muon = self.ds_section.muon and self.algo.optimizer.muon and bool(muon)
        for _, parameter in muon:
            parameter.use_muon = use_muon
        for _, parameter in adamw:
            parameter.use_muon = False
        self.ds_config = deepspeed_config(self.algo, self.config, self.ds_section, use_muon=use_muon)
        self.engine, self.optimizer, _, _ = ds_lib.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=self.ds_config)
        self.model = self.engine.module
        self.objective = BatchObjective(self.algo, entropy_coef=self.config.entropy_coef,
                                        entropy_metric_tokens=self.config.entropy_metric_tokens, pm=pm)

    @property
    def zero_stage(self) -> int:
        return self.ds_section.zero_stage

    def accumulate_gradients(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None) -> dict[str, float]:
        """Forward and backward over this rank's share of ``groups``; gradients reduced at the boundary."""
        self.engine.train()
        prepared = self.objective.prepare(groups, self.version, weights=weights)
        parts = split_by_token_budget(prepared.batch, self.config.micro_batch_tokens)
        mine = parts[self.rank::self.world]
        passes = -(-len(parts) // self.world)  # every rank runs the same number of passes
        sums: Counter[str] = Counter()
        for index in range(passes):
            real = index < len(mine)
            rows, micro = mine[index] if real else parts[0]
            self.engine.set_gradient_accumulation_boundary(index == passes - 1)
            micro_sums = sums if real else Counter()
            # Routing replay (mixture of experts) hooks the routers of the module DeepSpeed wraps.
            with self.objective.routing(self.engine.module, micro, micro_sums):
                logits, offset = self.objective.forward(self.engine.module, micro, call=self.engine,
                                                        device=self.engine.device)
                loss = self.objective.micro_loss(logits.float(), micro, prepared.sequence_advantages[rows],
                                                 prepared.staleness[rows], prepared.denominator, micro_sums,
                                                 logits_offset=offset)
                self.engine.backward(loss * (self.world if real else 0.0), scale_wrt_gas=False)
        return self.objective.metrics(prepared.batch, prepared.advantage_metrics, prepared.staleness,
                                      all_reduce_metric_sums(sums))

    def step(self, groups: Sequence[Group], *, weights: Sequence[float] | None = None) -> dict[str, float]:
        """One optimiser step over ``groups`` (every rank passes the same groups and weights)."""
        started = time.perf_counter()
        metrics = self.accumulate_gradients(groups, weights=weights)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            metrics["grad/norm"] = float(norm)
        self.version += 1
        elapsed = time.perf_counter() - started
        metrics["trainer/step_s"] = elapsed
        metrics["trainer/tokens_per_s"] = metrics["tokens/total"] / elapsed if elapsed > 0 else 0.0
        metrics["trainer/version"] = float(self.version)
        metrics["trainer/world_size"] = float(self.world)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """This rank's checkpoint shard: the files DeepSpeed writes for this rank, and the version.

        ``engine.save_checkpoint`` into a private temporary directory gives exactly this rank's part
        (its ZeRO partition of the optimiser state and, under ZeRO-3, of the parameters; rank 0 also
        writes the module states): relayrl-fault-tolerance's checkpointer then stores it as the
        rank's shard, commits it and replicates it to the rank's peer. Every rank must call it.
        """
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="relayrl-ds-save-") as directory:
            self.engine.save_checkpoint(directory, tag="relayrl", save_latest=False)
            files = {path.relative_to(directory).as_posix(): path.read_bytes()
                     for path in sorted(Path(directory).rglob("*")) if path.is_file()}
        return {"files": files, "version": self.version, "world_size": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from every rank's :meth:`state_dict` shard (every rank calls it with its own).

        DeepSpeed reads all ranks' partition files from one directory (it assumes a shared file
        system), so the shards are gathered into a private temporary directory on each rank first.
        The world size must be the one that saved (re-partitioning is not supported here).
        """
        import tempfile
        from pathlib import Path

        if int(state["world_size"]) != self.world:
            raise ValueError(f"checkpoint of {state['world_size']} ranks cannot load into {self.world}")
        shards: list[Any] = [None] * self.world
        dist.all_gather_object(shards, state["files"])
        with tempfile.TemporaryDirectory(prefix="relayrl-ds-load-") as directory:
            for files in shards:
                for name, data in files.items():
                    path = Path(directory) / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
            self.engine.load_checkpoint(directory, tag="relayrl", load_optimizer_states=True,
                                        load_lr_scheduler_states=True)
        self.version = int(state["version"])

    def named_full_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The module's whole state dict, one tensor at a time, on CPU: what weight sync publishes.

        Unlike :meth:`named_full_parameters` it keeps every name of a tied tensor (``lm_head.weight``
        and ``model.embed_tokens.weight``) and persistent buffers, as ``model.state_dict()`` would on
        a model that is not sharded. All ranks must iterate together (ZeRO-3 gathers collectively).
        """
        import deepspeed as ds_lib

        for name, value in self.model.state_dict(keep_vars=True).items():
            if self.zero_stage == 3 and hasattr(value, "ds_id"):  # a ZeRO-3 partitioned parameter
                with ds_lib.zero.GatheredParameters([value], modifier_rank=None):
                    yield name, value.detach().to("cpu", copy=True)
            else:
                yield name, value.detach().to("cpu", copy=True)

    def named_full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter, whole, on CPU, one at a time (all ranks must iterate together).

        Under ZeRO-3 each tensor is gathered alone and released before the next, so no rank ever
        holds the whole model; under ZeRO-1/2 parameters are whole on every rank already.
        """
        import deepspeed as ds_lib

        for name, parameter in self.model.named_parameters():
            if self.zero_stage == 3:
                with ds_lib.zero.GatheredParameters([parameter], modifier_rank=None):
                    yield name, parameter.detach().to("cpu", copy=True)
            else:
                yield name, parameter.detach().to("cpu", copy=True)
