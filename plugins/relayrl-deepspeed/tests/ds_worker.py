"""Run under torchrun: one DeepSpeed step on a fixed batch, gradients compared with the torch backend.

Usage: torchrun --nproc_per_node=2 ds_worker.py STAGE:BF16:MUON[,STAGE:BF16:MUON...] OUT_DIR

Each configuration (e.g. ``3:1:1``: ZeRO-3, bf16, Muon) trains a fresh model in the same process
group, one after the other: a launch of two ranks costs ~30 s of imports on 2 cores, a configuration
a few seconds. Rank 0 writes ``OUT_DIR/stageS-B-M.json`` for each.

With MUON=1 hidden matrices use DeepSpeed's Muon, whose ZeRO integration orthogonalises their
gradients during reduction: raw gradients are then comparable for the AdamW parameters only.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys

import torch
import torch.distributed as dist


def groups_for(model):
    from relayrl.core.arrays import pack_u32
    from relayrl.core.wire import Group, Trajectory, TrajectorySegment, Turn
    from relayrl.rollout.engines.torch_engine import TorchEngine
    from relayrl.rollout.protocol import GenerateRequest, SamplingParams

    engine = TorchEngine(copy.deepcopy(model))

    async def run():
        groups = []
        for g in range(3):
            prompt = [1, 4 + g, 9]
            spans = await asyncio.gather(*(engine.generate(GenerateRequest(
                request_id=f"{g}-{i}", prompt=prompt, params=SamplingParams(max_tokens=8 + 3 * i, top_p=0.9,
                                                                            seed=10 * g + i))) for i in range(4)))
            groups.append(Group(group_id=str(g), task_id=str(g), trajectories=[
                Trajectory(trajectory_id=f"{g}-{i}", task_id=str(g), group_id=str(g), sample_index=i,
                           reward=float((i + g) % 3 == 0),
                           segments=[TrajectorySegment(turns=[Turn(role="user", tokens=pack_u32(prompt)),
                                                              Turn(role="assistant", generated=span)])])
                for i, span in enumerate(spans)]))
        await engine.close()
        return groups

    return asyncio.run(run())


def check(stage: int, bf16: bool, muon: bool, out: str) -> None:
    from relayrl.algo.config import AlgoSection
    from relayrl.algo.optim import OptimizerSection
    from relayrl.rollout.testing.models import tiny_llama
    from relayrl.trainer.config import TrainerSection
    from relayrl.trainer.torch_backend import TorchTrainer
    from relayrl_deepspeed.backend import DeepSpeedTrainer
    from relayrl_deepspeed.config import DeepSpeedSection

    torch.set_num_threads(1)
    model = tiny_llama(seed=5)
    reference_model = copy.deepcopy(model)
    groups = groups_for(model)
    algo = AlgoSection(optimizer=OptimizerSection(lr=1e-3))
    trainer_config = TrainerSection(micro_batch_tokens=48)  # several micro-batches per rank
    trainer = DeepSpeedTrainer(model, algo=algo, config=trainer_config,
                               deepspeed=DeepSpeedSection(zero_stage=stage, bf16=bf16, muon=muon))
    muon_names = {name for name, parameter in model.named_parameters() if getattr(parameter, "use_muon", False)}
    initial = {name: parameter.detach().clone() for name, parameter in reference_model.named_parameters()}
    metrics = trainer.accumulate_gradients(groups)
    from deepspeed.utils import safe_get_full_grad

    ds_grads = {name: safe_get_full_grad(parameter) for name, parameter in trainer.model.named_parameters()}
    trainer.engine.step()
    published = dict(trainer.named_full_parameters())
    full_state = dict(trainer.named_full_state())  # what relayrl run publishes: every state-dict name
    if dist.get_rank() == 0:
        reference = TorchTrainer(reference_model, algo=algo, config=TrainerSection(micro_batch_tokens=10**6))
        reference_metrics = reference.accumulate_gradients(groups)
        report = {"loss": metrics["loss/value"], "reference_loss": reference_metrics["loss/value"],
                  "targets": metrics["tokens/targets"], "reference_targets": reference_metrics["tokens/targets"],
                  "max_grad_diff": 0.0, "max_grad": 0.0, "missing": [], "published": sorted(published),
                  "published_shapes_ok": all(tuple(published[name].shape) == tuple(p.shape)
                                             for name, p in reference_model.named_parameters()),
                  "muon_parameters": sorted(muon_names), "optimizer": trainer.ds_config["optimizer"]["type"],
                  "changed_by_step": sorted(name for name in published
                                            if not torch.equal(published[name].float(), initial[name].float())),
                  "published_finite": all(bool(torch.isfinite(t).all()) for t in published.values()),
                  "full_state_names_ok": sorted(full_state) == sorted(reference_model.state_dict()),
                  "full_state_matches": all(torch.equal(full_state[name], published[name]) for name in published)}
        for name, parameter in reference_model.named_parameters():
            if name in muon_names:
                continue  # orthogonalised during reduction: not a raw gradient
            grad = ds_grads.get(name)
            if grad is None or parameter.grad is None:
                report["missing"].append(name)
                continue
            report["max_grad_diff"] = max(report["max_grad_diff"],
                                          float((grad.float().cpu() - parameter.grad).abs().max()))
            report["max_grad"] = max(report["max_grad"], float(parameter.grad.abs().max()))
        with open(out, "w") as handle:
            json.dump(report, handle)
    dist.barrier()
    trainer.engine.destroy()


def main(configurations: str, out_dir: str) -> None:
    for configuration in configurations.split(","):
        stage, bf16, muon = (int(part) for part in configuration.split(":"))
        check(stage, bool(bf16), bool(muon), f"{out_dir}/stage{stage}-{bf16}-{muon}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
