"""The rollout process of ``relayrl run``: ``python -m relayrl.cli.run.rollout_process RUN_DIR [URL ...]``.

Runs the rollout manager (relayrl-rollout) over the engine servers at the given URLs (or, with
``[rollout] engines_in_process``, over engines it hosts itself, each kept current by its own
weight-sync controller; or, with a router that discovers engines such as Dynamo, over whatever
registered), through the configured router and the token-recording proxy; grades with the
configured environment (in the sandbox) and commits scored groups to the bus with a
:class:`relayrl.buffer.SegmentWriter`.
Four times a second it writes its cumulative counters to ``fleet/<producer>.json`` on the bus
(groups graded, committed and skipped; reward sum and count: the trainer's ``reward/fleet_mean``),
and every second ``status/rollout.json``: fleet throughput, the environment's grading
counters, and each engine's served weight version and applied updates (from its ``/health``),
which the trainer folds into its step metrics. With ``[eval] every_steps``, a
:class:`relayrl.rollout.periodic_eval.PeriodicEval` evaluates the held-out tasks through the same
fleet every N trainer steps (results in ``RUN_DIR/eval/run.jsonl``, the newest also as ``eval/...``
in the status metrics). The prompt scheduler gets the training tasks only (held-out ones removed,
:func:`relayrl.rollout.evaluation.split_tasks`). SIGTERM or SIGINT stops it cleanly: complete groups
are committed, in-flight ones discarded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import time
from typing import Any

import torch

from relayrl.algo.config import build_reward_shapers
from relayrl.buffer import SegmentWriter, create_prompt_scheduler, write_fleet_counters
from relayrl.cli.run.layout import RunLayout
from relayrl.core.config import Config
from relayrl.core.errors import StoreError
from relayrl.core.plugins import PluginManager, get_plugin_manager
from relayrl.rollout.config import SYNCHRONOUS_POLL_S, build_environment, build_harness, build_router
from relayrl.rollout.engines.http import HttpEngine
from relayrl.rollout.evaluation import split_tasks
from relayrl.rollout.manager import RolloutManager
from relayrl.rollout.models import load_tokenizer, make_chat_format
from relayrl.rollout.periodic_eval import PeriodicEval
from relayrl.rollout.protocol import SamplingParams
from relayrl.rollout.routing import TokenRecordingProxy
from relayrl.rollout.weights import apply_timings

__all__ = ["main", "run_rollout"]


async def run_rollout(layout: RunLayout, config: Config, engine_urls: list[str], *, pm: PluginManager | None = None,
                      engines: list[Any] | None = None, stop: threading.Event | None = None) -> None:
    """The fleet of a run until SIGTERM/SIGINT, or until ``stop`` is set when given (then no signal
    handlers are installed: the rollout runs in a thread of another process, ``[rollout] colocate``).
    ``engines``: engines built by the caller (else the engine servers at ``engine_urls``, or the
    rollout's own with ``engines_in_process``)."""
    section = config.rollout
    # Sandbox work (creation, every tool call, grading) runs in threads that mostly wait on child
    # processes. asyncio's default pool has cpu_count + 4 of them: on a laptop, six tool calls at
    # once for a fleet of dozens of agents, and the engines sit idle. One per trajectory in flight.
    in_flight = section.group_size * section.max_concurrent_groups
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=max(32, 2 * in_flight), thread_name_prefix="relayrl-rollout"))
    environment = build_environment(section, sandbox=layout.sandbox_section(config), pm=pm)
    tokenizer = load_tokenizer(layout.model_path(config))
    chat = make_chat_format(config.model, tokenizer)
    controllers: dict[str, Any] = {}  # engine id -> its weight controller, for engines hosted here
    if engines is not None:
        router = build_router(section, engines, deployment=str(layout.root), pm=pm)
    elif section.engines_in_process:
        engines = await in_process_engines(layout, config, pm=pm, controllers=controllers)
        router = build_router(section, engines, deployment=str(layout.root), pm=pm)
    else:
        engines = [HttpEngine(url, engine_id=f"engine-{index}") for index, url in enumerate(engine_urls)]
        # Engine servers registered with a router that discovers engines (--router of each server).
        router = build_router(section, engines, deployment=str(layout.root), registered=True, pm=pm)
    sampling = config.algo.sampling
    # routing_from=0: a mixture-of-experts engine records its routing (the trainer replays it with
    # [algo] routing_replay, and reports its agreement either way); engines of dense models ignore it.
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                            max_kept=sampling.max_kept, routing_from=0)
    bus = layout.bus(config)
    training, held_out = split_tasks(environment)  # the scheduler never sees a held-out task
    proxy = TokenRecordingProxy(router, group_calls=section.group_calls)

    async def served_version() -> int:
        """The oldest weight version a live engine serves (the synchronous mode waits for the trainer's)."""
        health = await asyncio.gather(*(engine.health() for engine in engines))
        return min((int(item.get("version", 0)) for item in health if item.get("alive", True)), default=0)

    manager = RolloutManager(
        scheduler=create_prompt_scheduler(training, config.buffer.prompts, seed=config.run.seed, pm=pm),
        harness=build_harness(section, pm=pm), proxy=proxy, chat=chat, sampling=params,
        grader=environment, writer=SegmentWriter.from_config(bus, section.producer_id, config.buffer), store=bus,
        tools=environment.tools, shapers=build_reward_shapers(config.algo, pm=pm), group_size=section.group_size,
        max_concurrent_groups=section.max_concurrent_groups, max_ahead_groups=section.max_ahead_groups,
        progress_poll_s=SYNCHRONOUS_POLL_S if section.synchronous else 0.1, skip_zero_variance=section.skip_zero_variance,
        zero_variance_tolerance=config.buffer.zero_variance_tolerance,
        synchronous_batch=config.buffer.batch_groups if section.synchronous else 0,
        # Engines a router discovers are not listed here: then only the trainer's progress is waited for.
        served_version=served_version if engines else None)

    health: list[dict[str, Any]] = []

    def write_status() -> None:
        layout.write_status("rollout", {
            "metrics": {**manager.metrics(), **environment.metrics(), **(evaluator.metrics() if evaluator else {}),
                        **weight_update_metrics(health), **engine_token_metrics(health),
                        "fleet/engines_alive": float(sum(bool(item.get("alive")) for item in health)),
                        "fleet/engine_version_min": float(min((item.get("version", 0) for item in health),
                                                              default=0)),
                        "fleet/engine_weight_updates": float(sum(item.get("weight_updates", 0)
                                                                 for item in health))},
            "engines": health})

    evaluator = None
    if config.eval.every_steps:  # each result reaches the trainer's next step through the status
        evaluator = PeriodicEval(config.eval, held_out, harness=manager.harness, proxy=proxy, chat=chat,
                                 sampling=params, grader=environment, tools=environment.tools, store=bus,
                                 results_dir=layout.eval_results, on_result=lambda _: write_status())

    async def report() -> None:
        beat = 0
        counters_failing = False
        while True:
            try:  # advisory, replaced by the next write: a store outage must not end the fleet
                write_fleet_counters(bus, section.producer_id, manager.fleet_counters())
                counters_failing = False
            except StoreError as exc:
                if not counters_failing:
                    print(f"rollout: could not write the fleet's counters to the bus ({exc}); retrying", flush=True)
                counters_failing = True
            if beat % 4 == 0:  # the status, with every engine's health, once a second from the start
                health[:] = await asyncio.gather(*(engine.health() for engine in engines))
                for item in health:  # engines hosted here report their weight updates through their controller
                    controller = controllers.get(item.get("engine_id", ""))
                    if controller is not None:
                        item["weight_sync"] = apply_timings(controller)
                write_status()
                layout.beat("rollout")  # the launcher's liveness check: needs no disk space, unlike the status
            beat += 1
            await asyncio.sleep(0.25)

    async def stop_when_asked(event: threading.Event) -> None:
        while not event.is_set():
            await asyncio.sleep(SYNCHRONOUS_POLL_S if section.synchronous else 0.1)
        manager.stop()

    background = [asyncio.create_task(report())]
    if evaluator is not None:
        background.append(asyncio.create_task(evaluator.run()))
    if stop is not None:
        background.append(asyncio.create_task(stop_when_asked(stop)))
    try:
        await manager.run(handle_signals=stop is None)
    finally:
        for task in background:  # an evaluation in flight is dropped: nothing of it was recorded yet
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*background)
        write_fleet_counters(bus, section.producer_id, manager.fleet_counters())
        # The final counters, with the engines' last health: they are being stopped alongside this process.
        write_status()
        await router.close()  # closes the engines (clients or in-process engines) too


def engine_token_metrics(health: list[dict[str, Any]]) -> dict[str, float]:
    """The engines' prompt work per generated token since they started (engines that count it: the torch
    engine): ``fleet/prefill_per_generated`` (prompt tokens run through the model per token generated)
    and ``fleet/prefix_reused_share`` (the share of prompt tokens taken from kept prefixes instead)."""
    counted = [item for item in health if all(isinstance(item.get(key), int)
                                              for key in ("prefill_tokens", "reused_tokens", "generated_tokens"))]
    prefill = sum(item["prefill_tokens"] for item in counted)
    reused = sum(item["reused_tokens"] for item in counted)
    generated = sum(item["generated_tokens"] for item in counted)
    if not generated:
        return {}
    return {"fleet/prefill_per_generated": prefill / generated,
            "fleet/prefix_reused_share": reused / (prefill + reused) if prefill + reused else 0.0}


def weight_update_metrics(health: list[dict[str, Any]]) -> dict[str, float]:
    """The slowest engine's last weight update (``weight_sync/fetch_s``, ``weight_sync/apply_s``: its
    pause), from the engines' health; the report plots them next to the trainer's publish time."""
    timings = [item["weight_sync"] for item in health if isinstance(item.get("weight_sync"), dict)]
    metrics = {}
    for name, key in (("weight_sync/fetch_s", "fetch_s"), ("weight_sync/apply_s", "pause_s"),
                      ("weight_sync/engine_update_s", "total_s")):
        values = [float(timing[key]) for timing in timings if isinstance(timing.get(key), (int, float))]
        if values:
            metrics[name] = max(values)
    held = sum(bool(timing.get("held_paused")) for timing in timings)
    if timings:
        metrics["fleet/engines_held_paused"] = float(held)
    return metrics


async def in_process_engines(layout: RunLayout, config: Config, *, pm: PluginManager | None = None,
                             controllers: dict[str, Any] | None = None) -> list[Any]:
    """The ``[rollout]`` engines built in this process, each following the bus with its own controller.

    Like the engine servers' ``--wait-for-weights``: returns once every engine serves a published
    version (never the model directory's weights).
    """
    from relayrl.rollout.config import build_engine
    from relayrl.rollout.weights import start_controller

    section = config.rollout
    bus = layout.bus(config)
    engines = []
    for index in range(section.engines):
        # dtype: what the trainer publishes (model.dtype, or engine_dtype for low-precision rollouts);
        # weight sync is bit-exact.
        engine = build_engine(section.engine, str(layout.model_path(config)), engine_id=f"engine-{index}", version=0,
                              max_batch=section.max_batch, seed=config.run.seed + index,
                              dtype=section.serving_dtype(config.model), options=section.engine_options, pm=pm)
        controller, _, _ = start_controller(engine, bus, config.weight_sync)
        if controllers is not None:
            controllers[engine.engine_id] = controller
        engines.append(engine)
    deadline = time.monotonic() + section.start_timeout_s
    while any(engine.served_version <= 0 for engine in engines):
        if time.monotonic() > deadline:
            raise SystemExit(f"in-process engines applied no published weights within {section.start_timeout_s} s")
        await asyncio.sleep(0.05)
    return engines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m relayrl.cli.run.rollout_process RUN_DIR [ENGINE_URL ...]", file=sys.stderr)
        return 2
    pm = get_plugin_manager()
    layout = RunLayout(argv[0])
    config = layout.load_config(pm=pm)
    # Without in-process engines this process only tokenises and routes: the cores belong to the
    # engine servers and the trainer.
    torch.set_num_threads(config.rollout.engine_threads if config.rollout.engines_in_process else 1)
    asyncio.run(run_rollout(layout, config, argv[1:], pm=pm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
