"""The ``[rollout]`` and ``[model]`` config sections: the fleet a run starts, and the model it trains."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from relayrl.core.config import Section, resolve_plugin, resolve_plugin_keywords
from relayrl.core.errors import ConfigError
from relayrl.core.plugins import Kind, PluginManager
from relayrl.rollout.hookspecs import ENGINES, ENVIRONMENTS, HARNESSES, ROUTERS

if TYPE_CHECKING:
    from relayrl.rollout.environment import Environment
    from relayrl.rollout.hookspecs import Harness
    from relayrl.rollout.protocol import InferenceEngine

__all__ = ["EvalSection", "ModelSection", "RolloutSection", "build_engine", "build_environment", "build_harness", "build_router"]


class ModelSection(Section, frozen=True):
    """``[model]``: the policy's weights, tokenizer and chat format."""

    path: str = ""
    """A local Hugging Face model directory (config + safetensors [+ tokenizer]); empty builds a fresh one."""
    init: dict[str, Any] = {}
    """Config options of a freshly built model (``vocab_size`` comes from the tokenizer): ``transformers``'
    ``LlamaConfig``'s, or ``Qwen3MoeConfig``'s for ``architecture = "qwen3-moe"``."""
    architecture: Literal["llama", "qwen3-moe"] = "llama"
    """A fresh model's architecture: dense Llama, or Qwen3-MoE (a mixture of experts: ``num_experts``,
    ``num_experts_per_tok``, ``moe_intermediate_size`` in ``init``)."""
    tokenizer: Literal["auto", "char"] = "auto"
    """``auto``: the model directory's tokenizer; ``char``: a character tokenizer over the environment's alphabet."""
    chat_format: Literal["auto", "raw", "plain", "template"] = "auto"
    """``raw``: content only (completion tasks); ``plain``: role markers; ``template``: the tokenizer's chat
    template; ``auto``: template when the tokenizer has one, else plain."""
    dtype: Literal["float32", "bfloat16"] = "float32"

    @property
    def configured(self) -> bool:
        """Whether the section names a model at all (``relayrl run`` requires it)."""
        return bool(self.path or self.init)

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.path and self.init:
            raise ConfigError(f"{path}: set either path or init, not both")
        if self.path and not (Path(self.path).expanduser() / "config.json").is_file():
            raise ConfigError(f"{path}.path: {self.path} is not a model directory (no config.json there)")
        if self.init and self.tokenizer == "auto":
            raise ConfigError(f"{path}.tokenizer: a fresh model (init) needs tokenizer = \"char\"")


MAX_GROUP_SIZE = 1024
"""The most samples per prompt ``[rollout] group_size`` accepts (a group is generated and held whole)."""
MAX_CONCURRENT_GROUPS = 4096
"""The most groups ``[rollout] max_concurrent_groups`` keeps in flight at once."""


SYNCHRONOUS_POLL_S = 0.01
"""How often every hand-over is polled in ``[rollout] synchronous`` mode (the batch to the trainer, its
weights to the engines, its progress to the fleet): generation and training alternate, so each poll
interval is idle time of the whole run."""


class RolloutSection(Section, frozen=True):
    """``[rollout]``: engines, router, harness and environment of the rollout fleet."""

    environment: str = "countdown"
    """Environment (``relayrl_rollout_environments``): tasks, tools and grading."""
    environment_options: dict[str, Any] = {}
    harness: str = "single-turn"
    """Agent harness (``relayrl_rollout_harnesses``)."""
    harness_options: dict[str, Any] = {}
    engine: str = "torch"
    """Engine backend of the engine processes (``relayrl_rollout_engines``): ``torch``, ``vllm`` (plugin)."""
    engine_options: dict[str, Any] = {}
    """The engine backend's options, as its registration declares them (``torch``: ``TorchEngineConfig``;
    vLLM's ``kept_sets``, ``engine_args``): a key it does not declare is an error."""
    engine_dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    """Low-precision rollouts: the engines sample in this dtype while the trainer trains in
    ``[model] dtype``; the trainer then publishes its weights converted to it, so weight sync stays
    bit-exact for the engines' representation. Empty: ``[model] dtype``."""
    engines: int = 1
    """Engines to start (engine server processes, or engines inside the rollout process)."""
    engines_in_process: bool = False
    """Run the engines inside the rollout process (no HTTP hop, one process less per engine); the
    default starts each as an engine server process that the launcher supervises."""
    colocate: bool = False
    """One machine, one process: the engine runs inside the trainer's process on the trainer's own
    parameters (no second copy of the model, no weight delta: each optimiser step is the update, taken
    while the engine pauses between two decode steps), and the rollout manager runs in a thread of it.
    Needs the ``torch`` engine, one engine, the ``torch`` trainer backend with one rank, and the model's
    dtype for serving. The bus still receives the weights every ``weight_sync.publish_every_steps``
    steps (``relayrl eval RUN_DIR@VERSION`` reads them there); the process uses ``[trainer] threads``."""
    engine_threads: int = 1
    """torch threads per engine process."""
    max_batch: int = 128
    """Requests an engine decodes together."""
    router: str = "least-loaded"
    """Router over the engines (``relayrl_rollout_routers``): ``round-robin``, ``least-loaded``, ``dynamo`` (plugin)."""
    router_options: dict[str, Any] = {}
    """The router's options, as its registration declares them (built in: ``RouterConfig``; Dynamo's
    ``policy``, ``discovery``): a key it does not declare is an error."""
    group_size: int = 8
    """Samples per prompt (G): the group whose rewards give the advantages."""
    group_calls: bool = True
    """Send a group's samples of one prompt, started together, to one engine in one call (one
    request and stream instead of G; the engine prefills the prompt once). False: one call per
    sample (the baseline ``benchmarks/overhead.py`` measures group calls against)."""
    max_concurrent_groups: int = 16
    max_ahead_groups: int = 32
    """Groups the fleet may run ahead of the trainer (back-pressure; see relayrl.rollout.manager)."""
    synchronous: bool = False
    """The synchronous baseline: generate one batch (``buffer.batch_groups`` groups) with the trainer's
    current weights, wait for the trainer to train on it and for the engines to serve its new weights,
    repeat. For measuring what asynchrony gains (``benchmarks/async_vs_sync.py``); see
    relayrl.rollout.manager. ``max_ahead_groups`` does not apply. ``relayrl run`` polls every
    hand-over every ``SYNCHRONOUS_POLL_S`` (10 ms) in this mode (``buffer.poll_interval_s`` and
    ``weight_sync.poll_interval_s`` are lowered to it)."""
    skip_zero_variance: bool = True
    """Do not commit groups whose samples all earned the same reward (no signal); they are still counted."""
    producer_id: str = "rollout-0"
    max_restarts: int = 5
    """Restarts of one process of the run (the trainer, an engine, the rollout process, a mirror)
    within ``restart_window_s`` before the run gives up: a rate, not a lifetime budget."""
    restart_window_s: float = 600.0
    """The window of ``max_restarts``: a process that dies more than ``max_restarts`` times within it
    ends the run; a death older than it is forgiven (it healed; a multi-day run meets many unrelated
    ones). 0 makes ``max_restarts`` a budget for the whole run."""
    liveness_timeout_s: float = 300.0
    """A process of the run that shows no sign of life for this long is taken for hung (stopped,
    deadlocked, stuck in a collective or a driver), named in an event and on the display, killed and
    restarted like a dead one. Signs: the trainer (its loop; a thread while it starts) and the rollout
    process touch ``status/<name>.alive`` every second, an engine answers ``GET /health``; a process is
    watched from its first sign on. Keep it above the slowest trainer step. 0 turns it off."""
    start_timeout_s: float = 300.0

    def check(self, pm: PluginManager | None, path: str) -> None:
        # relayrl-rollout ships no environment (relayrl-environments and plugins do). A process with none
        # installed (a trainer-only library install loading a run's config) does not judge the name: it
        # cannot build one either, and build_environment says so if it is asked to. With any installed,
        # the name and its options are checked here like every other plugin's.
        environments = bool(ENVIRONMENTS.registrations(pm))
        # Every plugin name, with the options its registration declares (a misspelt key names itself).
        kinds: tuple[tuple[str, Kind[Any]], ...] = (("environment", ENVIRONMENTS), ("harness", HARNESSES),
                                                    ("engine", ENGINES), ("router", ROUTERS))
        for key, kind in kinds:
            if key == "environment" and not environments:
                continue
            resolve_plugin(pm, kind, getattr(self, key), getattr(self, f"{key}_options"), path=f"{path}.{key}")
        for key in ("engines", "engine_threads", "max_batch", "group_size", "max_concurrent_groups", "max_ahead_groups"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{path}.{key}: must be at least 1")
        if self.group_size < 2:
            raise ConfigError(f"{path}.group_size: group advantages need at least 2 samples per prompt")
        if self.colocate and (self.engine != "torch" or self.engines != 1 or self.engines_in_process):
            raise ConfigError(f"{path}.colocate: runs one torch engine inside the trainer's process; it needs "
                              f"engine = \"torch\" and engines = 1 and not engines_in_process (got engine = "
                              f"{self.engine!r}, engines = {self.engines}, engines_in_process = {self.engines_in_process})")
        for key, most in (("group_size", MAX_GROUP_SIZE), ("max_concurrent_groups", MAX_CONCURRENT_GROUPS)):
            if getattr(self, key) > most:
                raise ConfigError(f"{path}.{key}: at most {most} (got {getattr(self, key)}): every sample of every "
                                  f"group in flight is held in memory at once")
        if self.max_restarts < 0 or self.restart_window_s < 0 or self.liveness_timeout_s < 0:
            raise ConfigError(f"{path}: max_restarts, restart_window_s and liveness_timeout_s must be at least 0 "
                              f"(got {self.max_restarts}, {self.restart_window_s}, {self.liveness_timeout_s})")

    def serving_dtype(self, model: ModelSection) -> str:
        """The dtype engines serve, and the trainer publishes in: ``engine_dtype``, else ``model.dtype``."""
        return self.engine_dtype or model.dtype


class EvalSection(Section, frozen=True):
    """``[eval]``: held-out evaluation during ``relayrl run``, on the rollout side.

    Every ``every_steps`` trainer steps (and once before the first), the rollout process samples the
    environment's held-out tasks through the fleet, as a stream of requests of its own next to the
    training groups, and grades them like ``relayrl eval``. Results: ``RUN_DIR/eval/run.jsonl`` (one
    line per evaluation), ``eval/...`` in ``metrics.jsonl``, the progress line and the report's curves.
    """

    every_steps: int = 0
    """Trainer steps between evaluations; 0: no evaluation during the run."""
    tasks: int = 64
    """The first N held-out tasks (``eval_tasks()`` of the environment); 0: all of them."""
    samples: int = 4
    """Samples per task (pass@k needs k <= samples)."""
    k: list[int] = []
    """pass@k to report; empty: 1 and ``samples``."""
    seed: int = 0
    """Per-sample seeds (the same every evaluation: the curves compare policies, not draws)."""
    pass_threshold: float = 1.0
    """A sample passes with at least this reward and no detector flag."""
    max_concurrent_groups: int = 64
    """Held-out tasks in flight at once: the evaluation's share of the fleet. Engines batch its requests
    with the training ones, so all at once is cheapest and spans the fewest policy versions; lower it
    to spread an evaluation of long agentic tasks over more time."""

    @property
    def ks(self) -> list[int]:
        return sorted(set(self.k)) if self.k else sorted({1, self.samples})

    def check(self, pm: PluginManager | None, path: str) -> None:
        for key in ("every_steps", "tasks"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{path}.{key}: must be at least 0")
        for key in ("samples", "max_concurrent_groups"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{path}.{key}: must be at least 1")
        if any(not 1 <= k <= self.samples for k in self.k):
            raise ConfigError(f"{path}.k: pass@k needs 1 <= k <= samples ({self.samples}), got {self.k}")


def build_environment(rollout: RolloutSection, *, sandbox: Any = None,
                      pm: PluginManager | None = None) -> Environment:
    """The environment ``[rollout] environment`` names, configured by ``environment_options``."""
    record, config = resolve_plugin(pm, ENVIRONMENTS, rollout.environment, rollout.environment_options,
                                    path="rollout.environment")
    return record.factory(config, sandbox=sandbox, pm=pm)


def build_engine(name: str, model_dir: str, *, engine_id: str, version: int, max_batch: int, seed: int,
                 dtype: str | None = None, options: Mapping[str, Any] | None = None,
                 pm: PluginManager | None = None) -> InferenceEngine:
    """The engine backend ``name`` (``relayrl_rollout_engines``) serving the model directory ``model_dir``:
    the one place engines are built (engine servers, the rollout process's in-process engines,
    ``relayrl eval``). ``options`` (``[rollout] engine_options``) are checked against the options the
    engine's registration declares; ``dtype`` is what the trainer publishes."""
    record, keywords = resolve_plugin_keywords(pm, ENGINES, name, options,
                                               path="rollout.engine")
    return record.factory(model_dir, engine_id=engine_id, version=version, max_batch=max_batch, seed=seed,
                          dtype=dtype, **keywords)


def build_router(rollout: RolloutSection, engines: list[InferenceEngine], *, deployment: str | None = None,
                 registered: bool = False, pm: PluginManager | None = None) -> InferenceEngine:
    """The router ``[rollout] router`` names over ``engines``, configured by ``router_options``.

    A router with the ``discovery`` capability (Dynamo) can find engines by itself. With
    ``registered`` the engines are processes that registered with it already (engine servers
    started with ``--router``): it is built with ``serve=False`` and one expected instance per
    engine; otherwise it serves the given engines itself. ``deployment`` (the run directory) scopes
    its namespace and discovery.
    """
    record, options = resolve_plugin_keywords(pm, ROUTERS, rollout.router, rollout.router_options,
                                              path="rollout.router")
    if "discovery" in record.capabilities:
        if registered:
            options.update(serve=False, expect_instances=len(engines))
        return record.factory(engines, deployment=deployment, **options)
    return record.factory(engines, **options)


def build_harness(rollout: RolloutSection, *, pm: PluginManager | None = None) -> Harness:
    """The agent harness ``[rollout] harness`` names, configured by ``harness_options``."""
    record, config = resolve_plugin(pm, HARNESSES, rollout.harness, rollout.harness_options,
                                    path="rollout.harness")
    return record.factory(config) if config is not None else record.factory()
