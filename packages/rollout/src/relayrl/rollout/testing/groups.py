"""Scored groups sampled by the real torch engine, for tests of code that trains on groups."""

from __future__ import annotations

import asyncio

import torch

from relayrl.core.arrays import pack_u32
from relayrl.core.wire import Group, Trajectory, TrajectorySegment, Turn
from relayrl.rollout.engines.torch_engine import TorchEngine
from relayrl.rollout.protocol import GenerateRequest, SamplingParams

__all__ = ["generate_groups"]


def generate_groups(model: torch.nn.Module, *, groups: int = 3, size: int = 4, top_p: float = 0.9, max_tokens: int = 10,
                    rewards: list[list[float]] | None = None, version: int = 0) -> list[Group]:
    """``groups`` groups of ``size`` trajectories sampled by the real torch engine from ``model``.

    Group ``g`` has the prompt ``[1, 3 + g, 7 + g]``; rewards alternate 0, 1 unless ``rewards[g][i]``
    says otherwise. Deterministic (a seed per sample). A mixture-of-experts model's spans carry their
    routing records.
    """
    engine = TorchEngine(model, version=version)

    async def run():
        out = []
        for g in range(groups):
            prompt = [1, 3 + g, 7 + g]
            spans = await asyncio.gather(*(engine.generate(GenerateRequest(
                request_id=f"{g}-{i}", prompt=prompt, params=SamplingParams(max_tokens=max_tokens, top_p=top_p,
                                                                            seed=100 * g + i, routing_from=0)))
                for i in range(size)))
            trajectories = [Trajectory(trajectory_id=f"{g}-{i}", task_id=f"task{g}", group_id=str(g), sample_index=i,
                                       reward=(rewards[g][i] if rewards else float(i % 2)),
                                       segments=[TrajectorySegment(turns=[Turn(role="user", tokens=pack_u32(prompt)),
                                                                          Turn(role="assistant", generated=span)])])
                            for i, span in enumerate(spans)]
            out.append(Group(group_id=str(g), task_id=f"task{g}", trajectories=trajectories))
        await engine.close()
        return out

    return asyncio.run(run())
