"""``relayrl eval``'s work: pick the tasks, start engines on the model, run the eval, write the outputs.

The engines, router, harness, sampling, sandbox and grader are built from the run config exactly
as ``relayrl run`` builds them (engines inside this process, as with ``[rollout]
engines_in_process``); :func:`relayrl.rollout.evaluation.evaluate` does the rest.

Output directory::

    eval.json            what was evaluated (model, version, tasks, samples, seed, sampling); a second
                         run with the same output continues it, with other settings it is refused
    samples.jsonl        one record per graded sample (relayrl.rollout.evaluation.SampleRecord)
    groups/NNNNNN.msgpack  each task's graded trajectories (the viewer page reads them)
    summary.json         pass@k, rewards and costs per task and overall
    summary.md           the same as markdown tables (printed at the end)
    index.html           the tables, flagged samples, and a link to trajectories.html
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from relayrl.cli.evals.model import EvalModel, quiet_transformers
from relayrl.core.config import Config, load_config
from relayrl.core.errors import RelayrlError
from relayrl.core.plugins import PluginManager
from relayrl.core.wire import Group, TaskSpec
from relayrl.rollout.hookspecs import ENVIRONMENTS

__all__ = ["EvalOptions", "TaskSet", "resolve_tasks", "run_eval"]

SPLITS = ("auto", "eval", "train")


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    tasks: str
    split: str = "auto"
    limit: int | None = None
    samples: int = 8
    ks: tuple[int, ...] = (1,)
    seed: int = 0
    pass_threshold: float = 1.0
    concurrency: int | None = None
    price_per_million_tokens: float | None = None
    price_per_gpu_hour: float | None = None
    viewer_tasks: int = 100


@dataclasses.dataclass(frozen=True)
class TaskSet:
    config: Config
    """The run config with ``[rollout] environment`` set to what serves the tasks."""
    tasks: list[TaskSpec]
    label: str
    """``countdown (eval split)``, ``tasks.jsonl``..."""


def resolve_tasks(config: Config, spec: str, *, split: str = "auto", limit: int | None = None,
                  sandbox: Any = None, pm: PluginManager | None = None) -> tuple[TaskSet, Any]:
    """The tasks ``spec`` names and the environment that serves and grades them.

    ``spec`` is an environment name (its held-out ``eval_tasks()`` for split ``eval``, its training
    tasks for ``train``, as a run trains on them: without any that repeats a held-out prompt; ``auto``:
    held out when it has any) or a task file or directory in
    the documented format (served by the ``code`` environment). ``sandbox``: the environment's
    ``[sandbox]`` section (default: the config's).
    """
    from relayrl.rollout.config import build_environment
    from relayrl.rollout.evaluation import split_tasks

    if split not in SPLITS:
        raise RelayrlError(f"--split {split}: expected one of {', '.join(SPLITS)}")
    environments = ENVIRONMENTS.registrations(pm)
    raw = json.loads(json.dumps(config.raw))  # a deep copy
    rollout = raw.setdefault("rollout", {})
    if spec in environments:
        if rollout.get("environment", "countdown") != spec:  # the run's options belong to its own environment
            rollout["environment_options"] = {}
        rollout["environment"] = spec
        label = spec
    elif Path(spec).exists():
        rollout["environment"] = "code"
        rollout["environment_options"] = {"tasks": str(Path(spec).resolve())}
        split, label = "train", spec  # a task file is evaluated whole
    else:
        raise RelayrlError(f"--tasks {spec}: neither an environment ({', '.join(sorted(environments))}) "
                           "nor a task file or directory")
    config = load_config(raw, pm=pm)
    environment = build_environment(config.rollout, sandbox=sandbox or config.sandbox, pm=pm)
    training, held_out = split_tasks(environment)
    if split == "eval" and not held_out:
        raise RelayrlError(f"--tasks {spec}: the environment has no held-out tasks (use --split train)")
    if split == "auto":
        split = "eval" if held_out else "train"
        if not held_out:
            print(f"relayrl eval: {spec} has no held-out split; evaluating its training tasks", file=sys.stderr)
    tasks = held_out if split == "eval" else training
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise RelayrlError(f"--tasks {spec}: no tasks")
    if label == spec and spec in environments:
        label = f"{spec} ({split} split)"
    return TaskSet(config=config, tasks=tasks, label=label), environment


def _spec(model: EvalModel, tasks: TaskSet, options: EvalOptions) -> dict[str, Any]:
    """What makes two evals the same eval (a resumed one must match it)."""
    config = tasks.config
    return {"model": str(model.run_dir or model.model_dir), "version": model.version, "tasks": tasks.label,
            "task_ids": [task.task_id for task in tasks.tasks], "samples": options.samples, "seed": options.seed,
            "pass_threshold": options.pass_threshold,
            "sampling": msgspec.to_builtins(config.algo.sampling),
            "harness": {"name": config.rollout.harness, "options": config.rollout.harness_options},
            "environment": {"name": config.rollout.environment, "options": config.rollout.environment_options}}


def _load_state(out: Path, spec: dict[str, Any]) -> dict[str, Any]:
    path = out / "eval.json"
    if not path.exists():
        return {"spec": spec, "sessions": []}
    state = json.loads(path.read_text())
    if state.get("spec") != spec:
        changed = sorted(key for key in {*spec, *state.get("spec", {})} if spec.get(key) != state["spec"].get(key))
        raise RelayrlError(f"{out} holds an eval with other settings ({', '.join(changed)}): "
                           "choose another --out, or repeat the same command to continue it")
    return state


def _write_json(path: Path, data: Any) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    partial.replace(path)


def _sandbox_section(model: EvalModel, out: Path) -> Any:
    """The ``[sandbox]`` of the eval: a run's own (its directory and a local bus hidden, as in the run),
    with the eval's output hidden too (other samples' answers are nothing an agent may read)."""
    from relayrl.cli.run.layout import RunLayout

    config = model.config
    section = RunLayout(model.run_dir).sandbox_section(config) if model.run_dir is not None else config.sandbox
    hidden = str(out.resolve())
    if hidden in section.hide_paths:
        return section
    return msgspec.structs.replace(section, hide_paths=[*section.hide_paths, hidden])


def run_eval(model: EvalModel, options: EvalOptions, out: Path, *, pm: PluginManager | None = None) -> tuple[dict[str, Any], TaskSet]:
    """Evaluate ``model`` as ``options`` say, writing to ``out``; return the summary and the tasks."""
    from relayrl.rollout.evaluation import RecordFile, completed_tasks

    for k in options.ks:
        if not 1 <= k <= options.samples:
            raise RelayrlError(f"--k {k}: pass@k needs 1 <= k <= --samples ({options.samples})")
    out.mkdir(parents=True, exist_ok=True)
    task_set, environment = resolve_tasks(model.config, options.tasks, split=options.split, limit=options.limit,
                                          sandbox=_sandbox_section(model, out), pm=pm)
    config = task_set.config
    spec = _spec(model, task_set, options)
    state = _load_state(out, spec)
    _write_json(out / "eval.json", state)
    records_file = RecordFile(out / "samples.jsonl")
    done = completed_tasks(records_file.read(), options.samples)
    remaining = [task for task in task_set.tasks if task.task_id not in done]
    print(f"relayrl eval: {model.label} on {task_set.label}: {len(task_set.tasks)} tasks x {options.samples} "
          f"samples" + (f" ({len(done)} done, continuing)" if done else ""), file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        if remaining:
            asyncio.run(_evaluate(model, config, environment, task_set, remaining, options, out, records_file, pm))
    finally:
        state["sessions"].append({"seconds": round(time.monotonic() - started, 3),
                                  "engines": config.rollout.engines, "tasks": len(remaining)})
        _write_json(out / "eval.json", state)
        environment.close()
    return write_outputs(out, model, task_set, options, state), task_set




async def _evaluate(model: EvalModel, config: Config, environment: Any, task_set: TaskSet, remaining: list[TaskSpec],
                    options: EvalOptions, out: Path, records_file: Any, pm: PluginManager | None) -> None:
    from relayrl.rollout.config import build_engine, build_harness, build_router
    from relayrl.rollout.evaluation import evaluate
    from relayrl.rollout.models import load_tokenizer, make_chat_format
    from relayrl.rollout.protocol import SamplingParams
    from relayrl.rollout.routing import TokenRecordingProxy

    section = config.rollout
    quiet_transformers()
    tokenizer = load_tokenizer(model.model_dir)
    chat = make_chat_format(config.model, tokenizer)
    engines = [build_engine(section.engine, str(model.model_dir), engine_id=f"engine-{index}", version=model.version,
                            max_batch=section.max_batch, seed=config.run.seed + index,
                            dtype=section.serving_dtype(config.model), options=section.engine_options, pm=pm)
               for index in range(section.engines)]
    router = build_router(section, engines, deployment=str(out.resolve()), pm=pm)
    sampling = config.algo.sampling
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                            max_kept=sampling.max_kept)
    groups = out / "groups"
    groups.mkdir(exist_ok=True)
    index_of = {task.task_id: index for index, task in enumerate(task_set.tasks)}
    finished = [0, 0]  # tasks, passing samples (this session)
    last_print = [0.0]

    def on_task(_: int, task: TaskSpec, group: Group, records: list[Any]) -> None:
        path = groups / f"{index_of[task.task_id]:06d}.msgpack"
        partial = path.with_suffix(".partial")
        partial.write_bytes(msgspec.msgpack.encode(group))
        os.replace(partial, path)
        records_file.append(records)  # last: a task is done once its records are on disk
        finished[0] += 1
        finished[1] += sum(record.passed for record in records)
        now = time.monotonic()
        if now - last_print[0] >= 2 or finished[0] == len(remaining):
            last_print[0] = now
            rate = finished[1] / (finished[0] * options.samples)
            print(f"  {finished[0]}/{len(remaining)} tasks, {rate:.3f} of samples passed", file=sys.stderr, flush=True)

    concurrency = options.concurrency or section.max_concurrent_groups
    try:
        await evaluate(remaining, samples=options.samples, harness=build_harness(section, pm=pm),
                       proxy=TokenRecordingProxy(router), chat=chat, sampling=params, grader=environment,
                       tools=environment.tools, seed=options.seed, pass_threshold=options.pass_threshold,
                       concurrency=concurrency, on_task=on_task)
    finally:
        await router.close()


def write_outputs(out: Path, model: EvalModel, task_set: TaskSet, options: EvalOptions,
                  state: dict[str, Any]) -> dict[str, Any]:
    """summary.json, summary.md and index.html (+ trajectories.html) from what ``out`` holds."""
    from relayrl.cli.evals.output import markdown, write_html
    from relayrl.rollout.evaluation import RecordFile, summarize

    position = {task.task_id: index for index, task in enumerate(task_set.tasks)}
    records = sorted((record for record in RecordFile(out / "samples.jsonl").read() if record.task_id in position),
                     key=lambda record: (position[record.task_id], record.sample))
    if not records:
        raise RelayrlError(f"{out}: no task was evaluated")
    engine_seconds = sum(session["seconds"] * session["engines"] for session in state["sessions"])
    # Tasks that name a category (the dataset of a reasoning-gym mix ...) are also summarised per category.
    categories = {task.task_id: str(task.metadata["category"]) for task in task_set.tasks if "category" in task.metadata}
    summary = summarize(records, options.ks, engine_seconds=engine_seconds,
                        price_per_million_tokens=options.price_per_million_tokens,
                        price_per_gpu_hour=options.price_per_gpu_hour, categories=categories or None)
    summary["spec"] = state["spec"]
    _write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown(summary, options.ks, title=_title(model, task_set, options)))
    write_html(out, summary, options.ks, title=_title(model, task_set, options), model_dir=model.model_dir,
               viewer_tasks=options.viewer_tasks)
    return summary


def _title(model: EvalModel, task_set: TaskSet, options: EvalOptions) -> str:
    return (f"{model.label} on {task_set.label}: {len(task_set.tasks)} tasks x {options.samples} samples, "
            f"seed {options.seed}")
