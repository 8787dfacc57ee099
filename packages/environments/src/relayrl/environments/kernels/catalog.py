"""The shipped kernel tasks, and a generator of fused elementwise chains for many more.

The shipped tasks follow KernelBench's first two levels, written as NumPy references the way a
first implementation would be: correct and idiomatic, with the waste a faster version removes
(temporaries a fused or in-place version avoids, ``x ** 3`` where ``x * x * x`` will do, a dense
``diag(d) @ x``, a reduction of a product that one ``einsum`` or ``dot`` computes, a softmax that
exponentiates twice). Every task has a ``fast`` candidate, hand-written, that the tests grade.

:func:`chain_task` draws a level-2 task: a chain of elementwise operations on one or two inputs,
written one temporary per operation; the generator's seed names the task.
"""

from __future__ import annotations

import random

import msgspec

from relayrl.environments.kernels.tasks import ArgSpec, KernelTask, Tolerance

__all__ = ["FAST", "SHIPPED", "chain_task", "make_tasks", "shipped_tasks"]


def _task(name: str, reference: str, args: list[ArgSpec], sizes: list[dict[str, int]], *, level: int = 1,
          description: str = "", tolerance: Tolerance | None = None) -> KernelTask:
    return KernelTask(name=name, reference="import numpy as np\n\n" + reference.strip() + "\n", args=args,
                      sizes=sizes, level=level, description=description, tolerance=tolerance or Tolerance())


ROWS = [{"B": 7, "D": 33}, {"B": 64, "D": 256}, {"B": 256, "D": 1024}]
VECTOR = [{"N": 1001}, {"N": 1 << 14}, {"N": 1 << 18}]
SQUARE = [{"N": 17}, {"N": 64}, {"N": 256}]
_ROW, _VEC = [ArgSpec(shape=["B", "D"])], [ArgSpec(shape=["N"])]
_LOOSE = Tolerance(rtol=1e-4, atol=1e-5)  # reductions whose summation order legitimately changes

SHIPPED: list[KernelTask] = [
    _task("gelu_tanh", """
def reference(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978846 * (x + 0.044715 * x ** 3)))
""", _VEC, VECTOR, description="GELU, tanh approximation", tolerance=_LOOSE),
    _task("swish", """
def reference(x):
    return x * (1.0 / (1.0 + np.exp(-x)))
""", _VEC, VECTOR, description="x * sigmoid(x)"),
    _task("cube_plus_square", """
def reference(x):
    return x ** 3 + x ** 2
""", _VEC, VECTOR, description="powers"),
    _task("polynomial", """
def reference(x):
    return 0.5 + 1.5 * x + 2.0 * x ** 2 - 0.25 * x ** 3 + 0.125 * x ** 4
""", _VEC, VECTOR, description="a quartic", tolerance=_LOOSE),
    _task("hardtanh_scale", """
def reference(x):
    y = np.minimum(x, 0.5)
    y = np.maximum(y, -0.5)
    return y * 2.0
""", _VEC, VECTOR, description="clamp then scale"),
    _task("row_sum_of_squares", """
def reference(x):
    return np.sum(x ** 2, axis=1)
""", _ROW, ROWS, description="per-row squared norm", tolerance=_LOOSE),
    _task("row_l2_normalise", """
def reference(x):
    return x / np.sqrt(np.sum(x ** 2, axis=1, keepdims=True))
""", [ArgSpec(shape=["B", "D"], low=0.1, high=1.0)], ROWS, description="rows to unit length", tolerance=_LOOSE),
    _task("softmax_rows", """
def reference(x):
    shifted = x - np.max(x, axis=1, keepdims=True)
    return np.exp(shifted) / np.sum(np.exp(shifted), axis=1, keepdims=True)
""", _ROW, ROWS, description="softmax over each row", tolerance=_LOOSE),
    _task("log_softmax_rows", """
def reference(x):
    shifted = x - np.max(x, axis=1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
""", _ROW, ROWS, description="log-softmax over each row", tolerance=_LOOSE),
    _task("mse", """
def reference(a, b):
    return np.mean((a - b) ** 2, keepdims=True)
""", [ArgSpec(shape=["N"]), ArgSpec(shape=["N"])], VECTOR, description="mean squared error", tolerance=_LOOSE),
    _task("cosine_similarity_rows", """
def reference(a, b):
    dots = np.sum(a * b, axis=1)
    return dots / (np.sqrt(np.sum(a ** 2, axis=1)) * np.sqrt(np.sum(b ** 2, axis=1)))
""", [ArgSpec(shape=["B", "D"], low=0.1, high=1.0), ArgSpec(shape=["B", "D"], low=0.1, high=1.0)], ROWS,
          description="cosine similarity of matching rows", tolerance=_LOOSE),
    _task("diag_matmul", """
def reference(d, x):
    return np.diag(d) @ x
""", [ArgSpec(shape=["N"]), ArgSpec(shape=["N", "N"])], SQUARE, description="diag(d) @ x", tolerance=_LOOSE),
    _task("matvec_by_broadcast", """
def reference(a, v):
    return np.sum(a * v, axis=1)
""", [ArgSpec(shape=["N", "N"]), ArgSpec(shape=["N"])], SQUARE, description="a @ v", tolerance=_LOOSE),
    _task("frobenius_norm", """
def reference(x):
    return np.sqrt(np.sum(x ** 2, keepdims=True))
""", [ArgSpec(shape=["N", "N"])], SQUARE, description="the Frobenius norm", tolerance=_LOOSE),
    _task("linear_relu", """
def reference(x, w, b):
    return np.maximum(x @ w + b, 0.0)
""", [ArgSpec(shape=["B", "D"]), ArgSpec(shape=["D", "D"]), ArgSpec(shape=["D"])],
          [{"B": 5, "D": 16}, {"B": 32, "D": 64}, {"B": 128, "D": 128}], level=2, description="a linear layer and ReLU",
          tolerance=_LOOSE),
    _task("scale_shift_tanh", """
def reference(x, scale, shift):
    y = x * scale
    y = y + shift
    return np.tanh(y)
""", [ArgSpec(shape=["B", "D"]), ArgSpec(shape=["D"]), ArgSpec(shape=["D"])], ROWS, level=2,
          description="an affine map and tanh"),
    _task("residual_layernorm", """
def reference(x, r):
    h = x + r
    mean = np.mean(h, axis=1, keepdims=True)
    var = np.mean((h - mean) ** 2, axis=1, keepdims=True)
    return (h - mean) / np.sqrt(var + 1e-5)
""", [ArgSpec(shape=["B", "D"]), ArgSpec(shape=["B", "D"])], ROWS, level=2, description="residual add, LayerNorm",
          tolerance=_LOOSE),
    _task("outer_product_sum", """
def reference(a, b):
    return np.sum(np.outer(a, b), axis=0)
""", [ArgSpec(shape=["N"]), ArgSpec(shape=["N"])], [{"N": 17}, {"N": 128}, {"N": 1024}],
          description="column sums of an outer product", tolerance=_LOOSE),
]
"""Tasks every install ships (a fixed list; :func:`make_tasks` adds generated chains)."""

FAST: dict[str, str] = {
    "gelu_tanh": """
import numpy as np

def kernel(x):
    inner = x * x
    inner *= 0.044715
    inner += 1.0
    inner *= x
    inner *= 0.7978846
    np.tanh(inner, out=inner)
    inner += 1.0
    inner *= x
    inner *= 0.5
    return inner
""",
    "cube_plus_square": """
import numpy as np

def kernel(x):
    out = x + 1.0
    out *= x
    out *= x
    return out
""",
    "row_sum_of_squares": """
import numpy as np

def kernel(x):
    return np.einsum("ij,ij->i", x, x)
""",
    "diag_matmul": """
import numpy as np

def kernel(d, x):
    return d[:, None] * x
""",
}
"""Hand-written faster candidates for some shipped tasks (what the tests grade as a speed-up)."""


def shipped_tasks(framework: str = "numpy") -> list[KernelTask]:
    """The shipped tasks of ``framework`` (``numpy``: :data:`SHIPPED`; ``torch``: the PyTorch catalog's)."""
    if framework == "torch":
        from relayrl.environments.kernels.torch_catalog import TORCH_SHIPPED

        return list(TORCH_SHIPPED)
    return list(SHIPPED)


_UNARY = ["np.tanh({x})", "{x} ** 2", "{x} ** 3", "np.maximum({x}, 0.0)", "np.abs({x})", "{x} * {c}", "{x} + {c}",
          "1.0 / (1.0 + np.exp(-{x}))", "np.minimum({x}, {c})"]
_BINARY = ["{x} * y", "{x} + y", "np.maximum({x}, y)", "{x} - y"]
# The same operations in PyTorch, in the same order: a seed draws the same chain in both frameworks.
_TORCH_UNARY = ["torch.tanh({x})", "{x} ** 2", "{x} ** 3", "torch.clamp({x}, min=0.0)", "torch.abs({x})", "{x} * {c}",
                "{x} + {c}", "1.0 / (1.0 + torch.exp(-{x}))", "torch.clamp({x}, max={c})"]
_TORCH_BINARY = ["{x} * y", "{x} + y", "torch.maximum({x}, y)", "{x} - y"]


def chain_task(seed: int, *, length: tuple[int, int] = (3, 6), framework: str = "numpy") -> KernelTask:
    """A generated level-2 task: a chain of elementwise operations, one temporary each."""
    rng = random.Random(seed)
    binary = rng.random() < 0.5
    unary, binary_ops = (_TORCH_UNARY, _TORCH_BINARY) if framework == "torch" else (_UNARY, _BINARY)
    lines = []
    for step in range(rng.randint(*length)):
        pool = unary + (binary_ops if binary else [])
        template = rng.choice(pool)
        source = "x" if step == 0 else f"t{step - 1}"
        constant = f"{rng.choice([-1, 1]) * rng.choice([0.25, 0.5, 1.5, 2.0, 3.0])}"
        lines.append(f"    t{step} = {template.format(x=source, c=constant)}")
    body = "\n".join(lines) + f"\n    return t{len(lines) - 1}\n"
    args = [ArgSpec(shape=["N"], low=-2.0, high=2.0)] + ([ArgSpec(shape=["N"], low=-2.0, high=2.0)] if binary else [])
    signature = "x, y" if binary else "x"
    task = _task(f"chain-{seed}", f"def reference({signature}):\n{body}", args, VECTOR, level=2,
                 description="a chain of elementwise operations", tolerance=Tolerance(rtol=1e-4, atol=1e-4))
    if framework == "torch":
        reference = task.reference.replace("import numpy as np", "import torch", 1)
        return msgspec.structs.replace(task, name=f"torch_chain-{seed}", reference=reference, framework="torch")
    return task


def make_tasks(count: int, *, seed: int = 0, length: tuple[int, int] = (3, 6), framework: str = "numpy") -> list[KernelTask]:
    """The shipped tasks, then generated chains of ``length`` operations up to ``count`` (seeds from ``seed``)."""
    tasks = shipped_tasks(framework)[:count]
    index = 0
    while len(tasks) < count:
        tasks.append(chain_task(seed + index, length=length, framework=framework))
        index += 1
    return tasks
