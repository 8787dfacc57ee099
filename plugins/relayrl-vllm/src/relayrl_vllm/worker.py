"""Code that runs inside vLLM's worker processes (``worker_extension_cls``).

vLLM mixes this class into its worker; the engine calls its methods by name through
``collective_rpc``, so no function has to be pickled (no ``VLLM_ALLOW_INSECURE_SERIALIZATION``).

Why ``reload_weights`` and not ``model.load_weights``: on the CPU build, loading repacks linear
weights into a CPU-friendly layout and leaves the original parameters empty, so a second
``load_weights`` fails; ``model_runner.reload_weights(..., is_checkpoint_format=True)`` re-runs the
loader's processing layer by layer and works on CPU and GPU alike.
"""

from __future__ import annotations

__all__ = ["RelayrlWorkerExtension"]


class RelayrlWorkerExtension:
    """Methods relayrl calls on every vLLM worker."""

    def relayrl_load_checkpoint_file(self, path: str) -> int:
        """Load the tensors of a safetensors file (checkpoint names and format) into the served model.

        The file lives in shared memory on the engine's host (``/dev/shm``): one copy in, one copy
        into the model; nothing is serialised through the RPC channel. Returns the tensor count.
        """
        from safetensors.torch import load_file

        tensors = load_file(path, device="cpu")
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        _prepack_cpu_experts_again(self.model_runner.get_model())
        return len(tensors)


def _prepack_cpu_experts_again(model) -> int:
    """Redo the CPU MoE kernel's weight prepacking after an in-place reload; returns the layers redone.

    vLLM's CPU experts kernel repacks each MoE layer's ``w13``/``w2`` into its grouped-GEMM layout once,
    when the model is first loaded. An in-place reload copies the new weights into those tensors in
    the *checkpoint* layout and skips the repack (it assumes the layout is final, as on GPUs), so the
    kernel would read unpacked weights: a mixture of experts served wrong logprobs after every weight
    update (found by the engine conformance suite's update test). Packing them again here restores
    exactly what a fresh load of the same weights computes. Only the unquantized CPU kernel (the one
    tested) is redone; other platforms and kernels are untouched.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    redone = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if type(experts).__name__ == "CPUUnquantizedExperts" and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
            redone += 1
    return redone
