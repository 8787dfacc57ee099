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
        return len(tensors)
