"""Kernel tasks written in PyTorch: the same interface on a CPU or on a CUDA device.

The tasks of :mod:`relayrl.environments.kernels.catalog`, as a first PyTorch implementation would write
them (one kernel launch per operation, a dense ``diag(d) @ x``, a softmax spelled out), with
``framework = "torch"``: the grader stages their inputs as tensors on its device (``cpu`` or
``cuda``) and times the candidate against the reference there. A candidate may use anything PyTorch
offers that runs without compiling (fused functional ops, in-place ops, ``einsum``, ``addmm``...);
Triton and inline CUDA, which compile on first use, are not graded yet (docs/kernels.md says why).

:data:`TORCH_FAST` holds hand-written faster candidates, what the tests and
``benchmarks/gpu/kernel_grader_cuda.py`` grade as a speed-up.
"""

from __future__ import annotations

from relayrl.environments.kernels.catalog import ROWS, SQUARE, VECTOR
from relayrl.environments.kernels.tasks import ArgSpec, KernelTask, Tolerance

__all__ = ["TORCH_FAST", "TORCH_SHIPPED"]

_ROW, _VEC = [ArgSpec(shape=["B", "D"])], [ArgSpec(shape=["N"])]
_LOOSE = Tolerance(rtol=1e-4, atol=1e-5)  # fused kernels sum and round in their own order


def _task(name: str, reference: str, args: list[ArgSpec], sizes: list[dict[str, int]], *, level: int = 1,
          description: str = "", tolerance: Tolerance | None = None) -> KernelTask:
    return KernelTask(name=f"torch_{name}", reference="import torch\n\n" + reference.strip() + "\n", args=args,
                      sizes=sizes, level=level, description=description, tolerance=tolerance or _LOOSE,
                      framework="torch")


TORCH_SHIPPED: list[KernelTask] = [
    _task("gelu_tanh", """
def reference(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978846 * (x + 0.044715 * torch.pow(x, 3))))
""", _VEC, VECTOR, description="GELU, tanh approximation"),
    _task("swish", """
def reference(x):
    return x * (1.0 / (1.0 + torch.exp(-x)))
""", _VEC, VECTOR, description="x * sigmoid(x)"),
    _task("softmax_rows", """
def reference(x):
    shifted = x - torch.max(x, dim=1, keepdim=True).values
    return torch.exp(shifted) / torch.sum(torch.exp(shifted), dim=1, keepdim=True)
""", _ROW, ROWS, description="softmax over each row"),
    _task("residual_layernorm", """
def reference(x, r):
    h = x + r
    mean = torch.mean(h, dim=1, keepdim=True)
    var = torch.mean((h - mean) ** 2, dim=1, keepdim=True)
    return (h - mean) / torch.sqrt(var + 1e-5)
""", [ArgSpec(shape=["B", "D"]), ArgSpec(shape=["B", "D"])], ROWS, level=2, description="residual add, LayerNorm"),
    _task("diag_matmul", """
def reference(d, x):
    return torch.diag(d) @ x
""", [ArgSpec(shape=["N"]), ArgSpec(shape=["N", "N"])], SQUARE, description="diag(d) @ x"),
    _task("linear_relu", """
def reference(x, w, b):
    return torch.relu(x @ w + b)
""", [ArgSpec(shape=["B", "D"]), ArgSpec(shape=["D", "D"]), ArgSpec(shape=["D"])],
          [{"B": 5, "D": 16}, {"B": 32, "D": 64}, {"B": 128, "D": 128}], level=2, description="a linear layer and ReLU"),
]
"""PyTorch tasks every install ships (``[rollout.environment_options] framework = "torch"``)."""

TORCH_FAST: dict[str, str] = {
    "torch_gelu_tanh": """
import torch

def kernel(x):
    return torch.nn.functional.gelu(x, approximate="tanh")
""",
    "torch_softmax_rows": """
import torch

def kernel(x):
    return torch.softmax(x, dim=1)
""",
    "torch_residual_layernorm": """
import torch

def kernel(x, r):
    return torch.nn.functional.layer_norm(x + r, x.shape[1:], eps=1e-5)
""",
    "torch_diag_matmul": """
import torch

def kernel(d, x):
    return d[:, None] * x
""",
}
"""Hand-written faster candidates for some PyTorch tasks."""
