"""relayrl-rollout's own plugin: its hookspecs, the torch engine, the built-in routers and harnesses
(the built-in environments are relayrl-environments')."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from relayrl.core.plugins import Registration, RelayrlPluginManager, hookimpl

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


def _torch_engine(model: str, **options: Any) -> InferenceEngine:
    from relayrl.rollout.engines.torch_engine import TorchEngine

    options.setdefault("stream_interval_s", SERVED_STREAM_INTERVAL_S)
    return TorchEngine.from_pretrained(model, **options)


def _router(policy: Literal["round-robin", "least-loaded"]) -> RouterFactory:
    def factory(engines: list[InferenceEngine], **options: Any) -> InferenceEngine:
        from relayrl.rollout.routing import Router

        return Router(engines, policy=policy, **options)

    return factory


@hookimpl
def relayrl_rollout_engines() -> Iterator[Registration[EngineFactory]]:
    yield Registration("torch", _torch_engine, "transformers causal LM, batched KV-cache decoding, in-place weight updates")


@hookimpl
def relayrl_rollout_routers() -> Iterator[Registration[RouterFactory]]:
    yield Registration("round-robin", _router("round-robin"), "each request to the next healthy engine")
    yield Registration("least-loaded", _router("least-loaded"), "each request to the healthy engine with fewest in flight")


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
