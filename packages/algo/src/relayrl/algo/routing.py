"""Mixture-of-experts routing: capture it in the engine, force it in the trainer (rollout routing replay).

An MoE layer's router picks ``top_k`` experts per token from its logits. Engine and trainer compute
those logits with different kernels, batch layouts and (with low-precision rollouts) dtypes, so a
token near a routing tie can go to different experts on the two sides: the trainer then scores a
different function than the one that sampled, and the importance ratio is noise. Routing replay
(Ma et al., arXiv:2510.11370, "R3") records the engine's choice per token and layer and makes the
trainer use it: the recorded experts are kept, and their gates are recomputed from the trainer's
own router logits over that set (softmax, then the same renormalisation the router applies), so
the router still receives gradient.

Routers are found by duck typing on the interface transformers' MoE models share (Qwen2/3-MoE,
OLMoE, Mixtral and others): a module whose class name ends in ``TopKRouter``, with ``top_k`` and
``num_experts``, whose forward returns ``(router_logits, gates, expert_indices)`` with
``gates = softmax(router_logits)`` at the chosen experts, renormalised over them when the router
normalises (``norm_topk_prob``; routers without that attribute, like Mixtral's, always do). A
router whose gating differs (sigmoid scores, expert-bias correction, grouped top-k) is not
recognised, and :func:`moe_routers` says so rather than replaying it wrongly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["RouterInfo", "RoutingCapture", "moe_routers", "recorded_routing", "replay_gates"]

# Gating that is not softmax-over-logits-then-top-k: replaying it with replay_gates would be wrong.
_UNSUPPORTED_GATING = ("e_score_correction_bias", "n_group", "topk_group", "routed_scaling_factor")


@dataclasses.dataclass(frozen=True)
class RouterInfo:
    """One MoE layer's router, in forward order."""

    name: str
    module: torch.nn.Module
    num_experts: int
    top_k: int
    normalizes: bool
    """Whether the gates are renormalised over the chosen experts."""


def moe_routers(model: torch.nn.Module) -> list[RouterInfo]:
    """The model's MoE routers in layer order; ``[]`` for a dense model.

    Raises ``NotImplementedError`` for a router whose gating this module cannot replay.
    """
    routers = []
    for name, module in model.named_modules():
        if not (type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k")
                and hasattr(module, "num_experts")):
            continue
        odd = [attribute for attribute in _UNSUPPORTED_GATING if getattr(module, attribute, None) is not None]
        if odd:
            raise NotImplementedError(f"{name} ({type(module).__name__}) gates with {odd}: routing replay supports "
                                      "softmax top-k routers only")
        routers.append(RouterInfo(name=name, module=module, num_experts=int(module.num_experts),
                                  top_k=int(module.top_k), normalizes=bool(getattr(module, "norm_topk_prob", True))))
    return routers


def replay_gates(router_logits: torch.Tensor, experts: torch.Tensor, *, normalizes: bool) -> torch.Tensor:
    """The gates a softmax top-k router gives ``experts`` (``[tokens, k]``): the softmax of its logits
    at those experts, renormalised over them when the router does, in the logits' dtype.

    Computed the way the routers compute theirs (softmax in float32, gather, divide by the sum), so
    when ``experts`` are the router's own choice the gates are bitwise the router's.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    gates = probs.gather(-1, experts)
    if normalizes:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(router_logits.dtype)


class RoutingCapture:
    """Records the experts each router picks, layer by layer, for every forward while active.

    ``with RoutingCapture(routers) as capture: model(...)``; then :meth:`take` returns one
    ``[rows, layers, top_k]`` int tensor per forward call (rows = the flattened batch x positions
    of that forward, in the router's order) and clears the record.

    Only forwards run by the thread that entered the block are recorded: forward hooks belong to the
    module, so two engines serving one model object from two threads would otherwise each record the
    other's forwards too (and a record would mix the two generations' routing).
    """

    def __init__(self, routers: list[RouterInfo]) -> None:
        if not routers:
            raise ValueError("no MoE routers to capture")
        self.routers = routers
        self._layers: list[torch.Tensor | None] = [None] * len(routers)
        self._handles: list[Any] = []
        self._thread: int | None = None

    def __enter__(self) -> RoutingCapture:
        self._thread = threading.get_ident()
        for layer, router in enumerate(self.routers):
            self._handles.append(router.module.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int) -> Any:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            if threading.get_ident() == self._thread:
                self._layers[layer] = output[2].detach()
        return record

    def take(self) -> torch.Tensor:
        """``[rows, layers, top_k]``: the experts of the last forward, every layer (int64)."""
        missing = [router.name for router, layer in zip(self.routers, self._layers) if layer is None]
        if missing:
            raise RuntimeError(f"routers {missing[:3]} did not run in the last forward")
        experts = torch.stack(self._layers, dim=1)  # type: ignore[arg-type]
        self._layers = [None] * len(self.routers)
        return experts


@contextlib.contextmanager
def recorded_routing(routers: list[RouterInfo], experts: torch.Tensor, mask: torch.Tensor, *, force: bool = True,
                     stats: Counter[str] | None = None) -> Iterator[None]:
    """Within the block, compare every router's choice with the recorded one and, with ``force``,
    route the recorded positions to the recorded experts.

    ``experts``: ``[batch, length, layers, top_k]`` expert ids the engine recorded; ``mask``:
    ``[batch, length]`` bool, the positions with a record (the others keep the router's own choice).
    The forwards inside must see inputs of shape ``[batch, length]``; keep the backward inside too,
    so that activation checkpointing's recomputation routes the same way. Forced gates come from
    :func:`replay_gates`, so gradients reach the router through the recorded experts' logits.

    ``stats`` (optional) accumulates, over recorded positions and layers: ``routing/compared``,
    ``routing/top1_differs`` (the router's first choice is not the engine's) and
    ``routing/set_differs`` (its set of experts is not the engine's).
    """
    if experts.shape[2] != len(routers):
        raise ValueError(f"routing recorded for {experts.shape[2]} MoE layers, the model has {len(routers)}")
    flat_mask = mask.reshape(-1, 1)
    handles = []

    def hook_for(layer: int, router: RouterInfo) -> Any:
        recorded = experts[:, :, layer, :].reshape(-1, experts.shape[3]).to(torch.int64)

        def compare_and_replace(module: torch.nn.Module, args: Any, output: Any) -> Any:
            logits, own = output[0], output[2]
            if own.shape != recorded.shape:
                raise RuntimeError(f"{router.name}: {tuple(own.shape)} routed rows, the record has "
                                   f"{tuple(recorded.shape)} (top-k or batch layout differs)")
            where = flat_mask.to(own.device)
            theirs = recorded.to(own.device)
            if stats is not None:  # (a checkpointed layer's recomputation counts twice: the ratios hold)
                rows = where[:, 0]
                stats["routing/compared"] += float(rows.sum())
                stats["routing/top1_differs"] += float(((own[:, 0] != theirs[:, 0]) & rows).sum())
                stats["routing/set_differs"] += float(
                    ((own.sort(dim=-1).values != theirs.sort(dim=-1).values).any(dim=-1) & rows).sum())
            if not force:
                return None
            chosen = torch.where(where, theirs, own)
            return (logits, replay_gates(logits, chosen, normalizes=router.normalizes), chosen, *output[3:])
        return compare_and_replace

    try:
        for layer, router in enumerate(routers):
            handles.append(router.module.register_forward_hook(hook_for(layer, router)))
        yield
    finally:
        for handle in handles:
            handle.remove()
