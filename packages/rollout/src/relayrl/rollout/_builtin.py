"""relayrl-rollout's own plugin: its hookspecs, the torch engine, the built-in routers and harnesses
(the built-in environments are relayrl-environments')."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from relayrl.core.config import Section
from relayrl.core.errors import ConfigError
from relayrl.core.plugins import PluginManager, Registration, RelayrlPluginManager, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.hookspecs import EngineFactory, HarnessFactory, RouterFactory
    from relayrl.rollout.protocol import InferenceEngine


@hookimpl
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    from relayrl.rollout import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


SERVED_STREAM_INTERVAL_S = 0.25
"""The torch engine's ``stream_interval_s`` as ``relayrl run`` and the engine server build it (unless
``[rollout] engine_options`` set one): a request's tokens reach its proxy in a few events instead of
one per token (benchmarks/overhead.py measured ~10% more groups per second on the quickstart), and an
engine that dies costs a resumed request at most this much regeneration."""


class TorchEngineConfig(Section, frozen=True):  # frozen as Section is (stated for mypy)
    """``[rollout] engine_options`` of the ``torch`` engine. (Its dtype is ``[rollout] engine_dtype``'s,
    else ``[model] dtype``'s: what the trainer publishes, so weight sync stays bit-exact.)"""

    stream_interval_s: float = SERVED_STREAM_INTERVAL_S
    """Hand a request's tokens to its proxy at most this often (and at its end); 0: every decode step."""
    share_prefill: bool = True
    """A group's samples share one prefill of their common prompt (see docs/rollout.md)."""
    prefix_cache_mib: float = 256.0
    """Memory for the KV caches of finished requests, so that a trajectory's next turn prefills only its
    new tokens (see docs/rollout.md); 0 keeps none."""
    continuous_batching: bool = True
    """Requests join the running batch between any two decode steps; False: only when it is empty
    (static batching, the baseline ``benchmarks/engine_batching.py`` measures)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.stream_interval_s < 0:
            raise ConfigError(f"{path}.stream_interval_s: must be at least 0, got {self.stream_interval_s}")
        if self.prefix_cache_mib < 0:
            raise ConfigError(f"{path}.prefix_cache_mib: must be at least 0, got {self.prefix_cache_mib}")


def _torch_engine(model: str, *, engine_id: str, version: int, max_batch: int, seed: int, dtype: str | None = None,
                  stream_interval_s: float = SERVED_STREAM_INTERVAL_S, share_prefill: bool = True,
                  prefix_cache_mib: float = 256.0, continuous_batching: bool = True) -> InferenceEngine:
    from relayrl.rollout.engines.torch_engine import TorchEngine

    return TorchEngine.from_pretrained(model, dtype=dtype or "float32", engine_id=engine_id, version=version,
                                       max_batch=max_batch, seed=seed, stream_interval_s=stream_interval_s,
                                       share_prefill=share_prefill, prefix_cache_mib=prefix_cache_mib,
                                       continuous_batching=continuous_batching)


def _router(policy: Literal["round-robin", "least-loaded"]) -> RouterFactory:
    def factory(engines: list[InferenceEngine], *, retries: int = 2, down_for_s: float = 2.0) -> InferenceEngine:
        from relayrl.rollout.routing import Router

        return Router(engines, policy=policy, retries=retries, down_for_s=down_for_s)

    return factory


@hookimpl
def relayrl_rollout_engines() -> Iterator[Registration[EngineFactory]]:
    yield Registration("torch", _torch_engine, "transformers causal LM, batched KV-cache decoding, in-place weight updates",
                       config=TorchEngineConfig)


@hookimpl
def relayrl_rollout_routers() -> Iterator[Registration[RouterFactory]]:
    from relayrl.rollout.routing import RouterConfig

    yield Registration("round-robin", _router("round-robin"), "each request to the next healthy engine",
                       config=RouterConfig)
    yield Registration("least-loaded", _router("least-loaded"), "each request to the healthy engine with fewest in flight",
                       config=RouterConfig)


@hookimpl
def relayrl_rollout_harnesses() -> Iterator[Registration[HarnessFactory]]:
    from relayrl.rollout.agent import CodingAgent, SingleTurn

    yield Registration("coding-agent", CodingAgent, "multi-turn tool use, parallel calls, self-compaction", config=CodingAgent.Config)
    yield Registration("single-turn", SingleTurn, "one answer, no tools", config=SingleTurn.Config)


@hookimpl
def relayrl_core_config_sections() -> Iterator[Registration[Any]]:
    from relayrl.rollout.config import EvalSection, ModelSection, RolloutSection

    yield Registration("model", ModelSection, "the policy's weights, tokenizer and chat format")
    yield Registration("rollout", RolloutSection, "engines, router, harness and environment of the rollout fleet")
    yield Registration("eval", EvalSection, "held-out evaluation during a run, on the rollout side")
