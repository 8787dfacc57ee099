"""The backend matrix of ``relayrl run``: every combination of engine, router, trainer and store.

Each cell is one nox session (``nox -s "backends(engine='vllm', router='dynamo', trainer='deepspeed',
store='s3')"``) that installs what the cell needs and runs ``test_cell.py`` on it. ``CI_CELLS`` is
the subset ``.ci/run`` runs; ``nox -s backends`` runs them all.
"""

from __future__ import annotations

import itertools

ENGINES = ("torch", "vllm")
ROUTERS = ("in-process", "http", "dynamo")
"""``in-process``: engines inside the rollout process behind the built-in router; ``http``: engine
server processes behind the built-in router; ``dynamo``: engine servers registered with Dynamo."""
TRAINERS = ("torch", "deepspeed")
STORES = ("file", "s3")
"""``file``: the run directory is the bus; ``s3``: a real S3 protocol server (moto) on loopback."""

CELLS = [dict(zip(("engine", "router", "trainer", "store"), cell))
         for cell in itertools.product(ENGINES, ROUTERS, TRAINERS, STORES)]

CI_CELLS = [
    # Every non-default backend at once: vLLM engines registered with Dynamo, a DeepSpeed trainer,
    # the bus on S3. The all-default cell (torch, http, torch, file) is the quickstart, which the
    # cli tests and the `system` session's fresh-install test already run.
    {"engine": "vllm", "router": "dynamo", "trainer": "deepspeed", "store": "s3"},
]


def cell_id(cell: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in cell.items())


def parse_cell(text: str) -> dict[str, str]:
    cell = dict(part.split("=", 1) for part in text.split(","))
    axes = {"engine": ENGINES, "router": ROUTERS, "trainer": TRAINERS, "store": STORES}
    if set(cell) != set(axes) or any(cell[key] not in values for key, values in axes.items()):
        raise ValueError(f"a cell names one of each: {axes}; got {text!r}")
    return cell


def overrides(cell: dict[str, str]) -> list[str]:
    """``relayrl run --set`` arguments that select the cell's backends."""
    sets = [f"rollout.engine={cell['engine']}"]
    if cell["router"] == "in-process":
        sets += ["rollout.engines_in_process=true", "rollout.router=least-loaded"]
    elif cell["router"] == "http":
        sets += ["rollout.router=least-loaded"]
    else:
        sets += ["rollout.router=dynamo"]
    if cell["trainer"] == "deepspeed":
        # fp32 ZeRO: the engines serve the model directory's float32 weights, bit-exact.
        sets += ["trainer.backend=deepspeed", "deepspeed.bf16=false"]
    return [argument for item in sets for argument in ("--set", item)]
