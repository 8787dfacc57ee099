"""Kernel tasks: a reference function, the inputs it takes, and how close a candidate must come.

A task (``KernelTask``) names a reference implementation (Python source defining ``reference``),
the arguments it takes (shapes over named sizes, dtype, value range), the sizes it is checked at
(the last one is also the one timed) and the tolerance of a correct output. The agent is shown the
reference source and asked for a function ``kernel`` with the same semantics that runs faster.
"""

from __future__ import annotations

from typing import Any

import msgspec

from relayrl.core.wire import TaskSpec

__all__ = ["FRAMEWORKS", "ArgSpec", "KernelTask", "Tolerance", "kernel_task", "task_spec"]


class ArgSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One argument: its shape (ints, or names looked up in a size), dtype and uniform value range."""

    shape: list[int | str]
    dtype: str = "float32"
    low: float = -1.0
    high: float = 1.0


class Tolerance(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An output element is correct when within ``atol + rtol * |reference|``."""

    rtol: float = 1e-5
    atol: float = 1e-6


FRAMEWORKS = ("numpy", "torch")
"""What a task's reference and candidates may be written with."""

DEFAULT_TOLERANCES = {"float64": Tolerance(rtol=1e-10, atol=1e-12), "float32": Tolerance(rtol=1e-5, atol=1e-6),
                      "float16": Tolerance(rtol=1e-3, atol=1e-3)}
"""Per output dtype, for tasks that do not set their own."""


class KernelTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One kernel-optimisation task (see the module docstring)."""

    name: str
    reference: str
    """Python source defining ``reference(*args)`` (it imports what it uses: NumPy, or PyTorch)."""
    args: list[ArgSpec]
    sizes: list[dict[str, int]]
    """Sizes the candidate is checked at; the last is also the one timed."""
    tolerance: Tolerance = Tolerance()
    description: str = ""
    level: int = 1
    """KernelBench's levels: 1 a single operation, 2 a fused chain of a few."""
    framework: str = "numpy"
    """What the reference and the candidate are written with: ``numpy`` (arrays in, an array out) or
    ``torch`` (tensors on the grader's device in, a tensor out)."""

    def __post_init__(self) -> None:
        if not self.args or not self.sizes:
            raise ValueError(f"kernel task {self.name}: needs arguments and at least one size")
        for arg in self.args:
            for dim in arg.shape:
                if isinstance(dim, str) and any(dim not in sizes for sizes in self.sizes):
                    raise ValueError(f"kernel task {self.name}: size {dim!r} missing from a size")
        if "def reference" not in self.reference:
            raise ValueError(f"kernel task {self.name}: the reference source defines no `reference`")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"kernel task {self.name}: framework {self.framework!r} is not one of {list(FRAMEWORKS)}")


def kernel_task(spec: TaskSpec) -> KernelTask:
    """The kernel task a :class:`TaskSpec` of kind ``kernel`` carries (``metadata["kernel"]``)."""
    return msgspec.convert(spec.metadata["kernel"], KernelTask)


def instruction(task: KernelTask) -> str:
    """What the agent is shown: the reference, the arguments, and what to write."""
    arguments = ", ".join(f"{arg.dtype}[{', '.join(str(dim) for dim in arg.shape)}]" for arg in task.args)
    sizes = "; ".join(", ".join(f"{name}={value}" for name, value in sizes.items()) for sizes in task.sizes)
    return (f"Write `kernel` with the semantics of `reference` below, faster. Arguments: {arguments} "
            f"(sizes {sizes}). Use {task.framework} only.\n\n{task.reference.strip()}\n")


def task_spec(task: KernelTask, task_id: str | None = None, **metadata: Any) -> TaskSpec:
    return TaskSpec(task_id=task_id or task.name, instruction=instruction(task), kind="kernel",
                    metadata={"kernel": msgspec.to_builtins(task), **metadata})
