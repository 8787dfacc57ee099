"""A rollout manager process for the SIGTERM test: a slow scripted model, groups committed as they finish.

Usage: python manager_process.py BUS_DIR
Prints READY once the first group is committed; exits 0 after SIGTERM with its complete groups committed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from relayrl.buffer import PromptScheduler, SegmentWriter
from relayrl.core.store import open_store
from relayrl.core.wire import TaskSpec
from relayrl.rollout.agent import SingleTurn
from relayrl.rollout.environment import with_rewards
from relayrl.rollout.manager import RolloutManager
from relayrl.rollout.protocol import GenerateRequest, SamplingParams, StreamEvent
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.testing.scripted import CHAT, ScriptedEngine


class SlowEngine(ScriptedEngine):
    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        async for event in super().stream(request):
            await asyncio.sleep(0.01)  # a generation takes a while: SIGTERM lands mid-group
            yield event


class Grader:
    async def grade(self, task, trajectories, answers):
        return [with_rewards(t, float(t.sample_index == 0)) for t in trajectories]


async def main(bus: str) -> None:
    store = open_store(bus)
    manager = RolloutManager(scheduler=PromptScheduler([TaskSpec(task_id="t", instruction="q")], seed=0),
                             harness=SingleTurn(), proxy=TokenRecordingProxy(SlowEngine(["a fairly long answer"] * 10**4,
                                                                                         "unused")),
                             chat=CHAT, sampling=SamplingParams(), grader=Grader(),
                             writer=SegmentWriter(store, "rollout-sig", groups_per_segment=2), store=store,
                             group_size=3, max_concurrent_groups=2, max_ahead_groups=10**6)
    runner = asyncio.create_task(manager.run(handle_signals=True))
    while manager.committed_groups < 1:
        await asyncio.sleep(0.01)
    print("READY", flush=True)
    await runner


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
