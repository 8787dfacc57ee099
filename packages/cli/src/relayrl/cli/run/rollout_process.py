"""The rollout process of ``relayrl run``: ``python -m relayrl.cli.run.rollout_process RUN_DIR URL [URL ...]``.

Runs the rollout manager (relayrl-rollout) over the engine servers at the given URLs, through the
configured router and the token-recording proxy; grades with the configured environment (in the
sandbox) and commits scored groups to the bus with a :class:`relayrl.buffer.SegmentWriter`.
Four times a second it writes its cumulative counters to ``fleet/<producer>.json`` on the bus
(groups graded, committed and skipped; reward sum and count: the trainer's ``reward/fleet_mean``),
and every second ``status/rollout.json``: fleet throughput, the environment's grading
counters, and each engine's served weight version and applied updates (from its ``/health``),
which the trainer folds into its step metrics. SIGTERM or SIGINT stops it cleanly: complete groups
are committed, in-flight ones discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import torch

from relayrl.algo.config import build_reward_shapers
from relayrl.buffer import SegmentWriter, create_prompt_scheduler
from relayrl.cli.run.layout import RunLayout
from relayrl.core.config import Config
from relayrl.core.plugins import get_plugin_manager
from relayrl.rollout.config import build_environment, build_harness, build_router
from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.manager import RolloutManager, write_fleet_counters
from relayrl.rollout.models import load_tokenizer, make_chat_format
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy

__all__ = ["main", "run_rollout"]


async def run_rollout(layout: RunLayout, config: Config, engine_urls: list[str], *, pm: Any = None) -> None:
    section = config.rollout
    environment = build_environment(section, sandbox=config.sandbox, pm=pm)
    tokenizer = load_tokenizer(layout.model_path(config))
    chat = make_chat_format(config.model, tokenizer)
    engines = [HttpEngine(url, engine_id=f"engine-{index}") for index, url in enumerate(engine_urls)]
    router = build_router(section, engines, deployment=str(layout.root), pm=pm)
    sampling = config.algo.sampling
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                            max_kept=sampling.max_kept)
    bus = layout.bus(config)
    manager = RolloutManager(
        scheduler=create_prompt_scheduler(environment.tasks(), config.buffer.prompts, seed=config.run.seed, pm=pm),
        harness=build_harness(section, pm=pm), proxy=TokenRecordingProxy(router), chat=chat, sampling=params,
        grader=environment, writer=SegmentWriter.from_config(bus, section.producer_id, config.buffer), store=bus,
        tools=environment.tools, shapers=build_reward_shapers(config.algo, pm=pm), group_size=section.group_size,
        max_concurrent_groups=section.max_concurrent_groups, max_ahead_groups=section.max_ahead_groups,
        progress_poll_s=0.1, skip_zero_variance=section.skip_zero_variance,
        zero_variance_tolerance=config.buffer.zero_variance_tolerance)

    async def report() -> None:
        beat = 0
        while True:
            write_fleet_counters(bus, section.producer_id, manager.fleet_counters())
            beat += 1
            if beat % 4:
                await asyncio.sleep(0.25)
                continue
            health = await asyncio.gather(*(engine.health() for engine in engines))
            layout.write_status("rollout", {
                "metrics": {**manager.metrics(), **environment.metrics(),
                            "fleet/engines_alive": float(sum(bool(item.get("alive")) for item in health)),
                            "fleet/engine_version_min": float(min((item.get("version", 0) for item in health), default=0)),
                            "fleet/engine_weight_updates": float(sum(item.get("weight_updates", 0) for item in health))},
                "engines": health})
            await asyncio.sleep(0.25)

    reporter = asyncio.create_task(report())
    try:
        await manager.run(handle_signals=True)
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        write_fleet_counters(bus, section.producer_id, manager.fleet_counters())
        for engine in engines:
            await engine.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m relayrl.cli.run.rollout_process RUN_DIR ENGINE_URL [ENGINE_URL ...]", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # this process only tokenises and routes; the cores belong to engines and trainer
    pm = get_plugin_manager()
    layout = RunLayout(argv[0])
    asyncio.run(run_rollout(layout, layout.load_config(pm=pm), argv[1:], pm=pm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
