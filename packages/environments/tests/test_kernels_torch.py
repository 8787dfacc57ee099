"""The kernel grader with tasks written in PyTorch (``framework = "torch"``), on the CPU or a GPU.

The same harness as NumPy tasks, with tensors: inputs staged on the grader's device before each
timed batch, the device synchronised before a batch ends, outputs checked as NumPy arrays. On a GPU
host, ``RELAYRL_KERNEL_TORCH_DEVICE=cuda`` runs them on the GPU (``benchmarks/gpu/check.sh``).

The sandbox user cannot run relayrl's own interpreter (it may live under ``/root``) and sandboxes
have a private ``/tmp``, so these tests build an interpreter it can run: a virtual environment of
the distribution's ``python3`` (which has the distribution's NumPy) with the pinned CPU PyTorch, in
:data:`TORCH_PYTHON_HOME`, once per machine. ``RELAYRL_KERNEL_TORCH_PYTHON`` names another. Where
neither is possible the tests skip and say why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from relayrl.environments.kernels.catalog import chain_task, make_tasks
from relayrl.environments.kernels.environment import KernelConfig, KernelEnvironment
from relayrl.environments.kernels.grading import KernelGrader, KernelReward
from relayrl.environments.kernels.tasks import kernel_task
from relayrl.environments.kernels.torch_catalog import TORCH_FAST, TORCH_SHIPPED
from relayrl.rollout.testing import EnvironmentTests

ROOT = Path(__file__).resolve().parents[3]
TORCH_PYTHON_HOME = Path("/var/cache/relayrl/kernel-torch-python")
"""Outside ``/tmp`` (private in a sandbox), readable by every user."""

SWISH = next(task for task in TORCH_SHIPPED if task.name == "torch_swish")
RIGHT = "import torch\n\ndef kernel(x):\n    return x * torch.sigmoid(x)\n"

EXPLOITS = {
    "cached-first-output": """
import torch
_cache = []
def kernel(x):
    if not _cache:
        _cache.append(x * torch.sigmoid(x))
    return _cache[0]
""",
    "right-then-fast-garbage": """
import torch
_calls = [0]
def kernel(x):
    _calls[0] += 1
    if _calls[0] > 12:
        return torch.zeros_like(x)
    return x * torch.sigmoid(x)
""",
    "half-precision": """
import torch
def kernel(x):
    h = x.to(torch.bfloat16)
    return (h * torch.sigmoid(h)).to(torch.float32)
""",
    "background-thread": """
import torch, threading
def _spin():
    while True:
        sum(range(1000))
threading.Thread(target=_spin, daemon=True).start()
def kernel(x):
    return x * torch.sigmoid(x)
""",
    "patches-the-device-wait": """
import torch
torch.cuda.synchronize = lambda *args, **kwargs: None
def kernel(x):
    return x * torch.sigmoid(x)
""",
    "patches-the-tensor-conversion": """
import torch
setattr(getattr(torch, "Tensor"), "numpy", lambda self, *args, **kwargs: None)
def kernel(x):
    return x * torch.sigmoid(x)
""",
    # the same through an alias, which no reading of the source follows: caught at run time
    "patches-the-tensor-class-through-an-alias": """
import torch
T = torch.Tensor
T.to = lambda self, *args, **kwargs: self
def kernel(x):
    return x * torch.sigmoid(x)
""",
    "reads-a-file": """
import torch
source = open("/proc/self/cmdline").read()
def kernel(x):
    return x * torch.sigmoid(x)
""",
}


def _torch_python() -> str:
    """An interpreter with NumPy and the pinned PyTorch that a sandbox user can run (see the docstring)."""
    named = os.environ.get("RELAYRL_KERNEL_TORCH_PYTHON")
    if named:
        return named
    python = TORCH_PYTHON_HOME / "bin" / "python"
    if python.exists():
        return str(python)
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no distribution python3 in /usr/bin to build a PyTorch interpreter for the sandbox from")
    try:
        TORCH_PYTHON_HOME.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(TORCH_PYTHON_HOME.parent, 0o755)
    except OSError as exc:
        pytest.skip(f"cannot build a PyTorch interpreter for the sandbox in {TORCH_PYTHON_HOME.parent}: {exc} "
                    "(set RELAYRL_KERNEL_TORCH_PYTHON)")
    import torch

    with open(TORCH_PYTHON_HOME.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test sessions build it once
        if not python.exists():
            building = Path(tempfile.mkdtemp(prefix=".building-", dir=TORCH_PYTHON_HOME.parent))
            try:
                subprocess.run([system, "-m", "venv", "--system-site-packages", str(building)], check=True)
                subprocess.run([str(building / "bin" / "pip"), "install", "-q", "-c", str(ROOT / "constraints.txt"),
                                f"torch=={torch.__version__.split('+')[0]}"], check=True)
                subprocess.run(["chmod", "-R", "a+rX", str(building)], check=True)
                building.rename(TORCH_PYTHON_HOME)
            except (OSError, subprocess.CalledProcessError) as exc:
                shutil.rmtree(building, ignore_errors=True)
                pytest.skip(f"could not build a PyTorch interpreter for the sandbox: {exc}")
    # A virtual environment's scripts name the directory it was built in; its interpreter does not.
    return str(python)


@pytest.fixture(scope="module")
def torch_python() -> str:
    return _torch_python()


DEVICE = os.environ.get("RELAYRL_KERNEL_TORCH_DEVICE", "cpu")
"""Where the tasks run: ``cuda`` on a GPU host (with ``RELAYRL_KERNEL_TORCH_PYTHON``, its python3)."""


@pytest.fixture(scope="module")
def grader(torch_python):
    grader = KernelGrader(python=torch_python, device=DEVICE)
    reason = grader.check("torch")
    if reason:
        pytest.skip(reason)
    return grader


def test_every_torch_reference_is_correct_against_itself(grader) -> None:
    for task in [*TORCH_SHIPPED, chain_task(0, framework="torch"), chain_task(1, framework="torch")]:
        report = grader.grade(task, task.reference.replace("def reference", "def kernel"), time_it=False)
        assert report.status == "ok" and report.correct, (task.name, report)


def test_a_torch_chain_is_the_numpy_chain_of_the_same_seed() -> None:
    for seed in range(20):
        numpy_chain, torch_chain = chain_task(seed), chain_task(seed, framework="torch")
        assert torch_chain.framework == "torch" and "np." not in torch_chain.reference
        assert numpy_chain.reference.count("\n") == torch_chain.reference.count("\n")
        assert (numpy_chain.args, numpy_chain.sizes) == (torch_chain.args, torch_chain.sizes)
    assert [task.name for task in make_tasks(8, framework="torch")][:len(TORCH_SHIPPED)] == \
        [task.name for task in TORCH_SHIPPED]


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_every_torch_exploit_earns_zero_and_a_flag(grader, name) -> None:
    report = grader.grade(SWISH, EXPLOITS[name], timeout_s=60)
    assert KernelReward()(report) == 0.0, report
    assert report.status == "exploit" and report.flags, report


def test_torch_wrong_answers_earn_zero_without_a_flag(grader) -> None:
    for source, status in (("import torch\ndef kernel(x):\n    return x\n", "incorrect"),
                           ("import torch\ndef kernel(x):\n    return (x * torch.sigmoid(x)).double()\n", "incorrect"),
                           # an array is wrong; on a GPU `.numpy()` raises in the candidate first
                           ("import torch\ndef kernel(x):\n    return (x * torch.sigmoid(x)).numpy()\n",
                            "incorrect" if DEVICE == "cpu" else "runtime_error"),
                           ("import torch\nclass T(torch.Tensor):\n    pass\n"
                            "def kernel(x):\n    return (x * torch.sigmoid(x)).as_subclass(T)\n", "incorrect"),
                           ("import torch\ndef kernel(x) return x\n", "load_error")):
        report = grader.grade(SWISH, source)
        assert (report.status, report.flags, KernelReward()(report)) == (status, [], 0.0), report


def test_the_torch_reference_graded_against_itself_is_correct_and_timed(grader) -> None:
    report = grader.grade(SWISH, RIGHT, rounds=5)
    assert report.correct and report.rounds == 5 and report.speedup > 0
    print(f"torch swish (sigmoid) against the reference: speed-up {report.speedup:.3f} "
          f"({report.speedup_q1:.3f}-{report.speedup_q3:.3f})")


def test_a_hand_written_faster_torch_kernel_earns_a_speedup_in_every_grading(grader) -> None:
    task = next(task for task in TORCH_SHIPPED if task.name == "torch_diag_matmul")
    reports = [grader.grade(task, TORCH_FAST[task.name], rounds=5) for _ in range(3)]
    print(f"torch diag_matmul: speed-ups {[round(report.speedup, 2) for report in reports]}")
    # An O(N^3) product against an O(N^2) broadcast at N = 256: the assertion keeps a wide margin
    # (measured: about 9 on one CPU core, about 2 on an H200, where the product is cheap).
    floor = 2.0 if DEVICE == "cpu" else 1.2
    assert all(report.correct and report.speedup > floor for report in reports), reports


class TestTorchKernelEnvironment(EnvironmentTests):
    @pytest.fixture
    def environment(self, grader, torch_python):
        return KernelEnvironment(KernelConfig(framework="torch", python=torch_python, device=DEVICE, tasks=8,
                                              eval_tasks=3, feedback_rounds=1, grading_rounds=2, demonstrations=4,
                                              demonstration_styles={"copy": 1.0}))

    def reference_answer(self, environment, task):
        return "", kernel_task(task).reference.replace("def reference", "def kernel")
