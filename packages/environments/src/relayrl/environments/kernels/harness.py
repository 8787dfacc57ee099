"""The kernel grader's in-sandbox harness: correctness on fresh inputs, then interleaved timing.

This file is a *script*: the host runs its source in a sandbox (``python -I -c SOURCE harness``)
with the sandbox's interpreter, sends one job as JSON on stdin and reads one report as JSON on
stdout. It imports only the standard library and NumPy (and PyTorch for a task written in it), and
is never imported on the host to grade (tests import it to check its helpers).

Three processes, so that nothing the candidate runs can touch the clock or the reference:

* the **harness** (this process) draws every input from ``os.urandom``, keeps the clock, and
  checks every output;
* a **reference worker** holding only the task's reference function;
* a **candidate worker** holding only the candidate's source.

Workers receive their inputs through a shared-memory file the harness writes just before each
batch (the reference's file is unlinked before the candidate starts), run the batch when told,
and reply when done. The harness times each batch from outside the worker: on the CPU by the CPU
time the worker's threads ran in it (the kernel's account), on a device by the round trip on its own
clock; the candidate is charged whatever CPU it spends outside its batches beyond the reference's
(:meth:`Session.timed_seconds`). Every call of a batch gets inputs no earlier call saw, so neither a
cache nor a lookup of "known" inputs can answer it.
After each timed batch the worker reports a digest of every output (the dot product with random
weights, drawn from a seed the harness picks per grading and sends with the request), which the
harness compares, within the task's tolerance, with the reference's outputs for the same inputs: a
candidate that answers the timed calls differently from the checked ones fails. Batches alternate
between the workers (order swapped each round) on one pinned core, with the thread counts of
NumPy's libraries fixed at one.

A task's ``framework`` is ``numpy`` (functions take and return arrays) or ``torch`` (tensors on the
job's ``device``, ``cpu`` or ``cuda``): before each timed batch, untimed, every call's inputs are
copied to the device; the batch ends when the device has finished (the worker synchronises before
it replies, so work left queued on the device, on any stream, is timed); outputs come back to the
host as NumPy arrays for the same checks, made inside the timed batch.

What the candidate worker may do is narrowed three times. The kernel first: before either worker
loads its function, it locks itself down (:func:`lock_down`: not dumpable, no capabilities, a
seccomp filter), so no path reaches another process, another core, a timer or (on the CPU) a file.
A Python audit hook, installed after the candidate's source is compiled, refuses (and reports on a
channel the candidate cannot reach back into) file opens, imports of modules not already loaded,
new threads and processes, signals, sockets, ``ctypes``, frames and dynamic ``exec``/``compile``.
And, whatever the hook misses, the harness
watches the operating system: the candidate worker must keep the thread count it had after
loading, start no process, and use no more CPU outside its batches than the reference (work done
outside the timed region: in a background thread or between batches). Past a slack, any of these is
a flag; below it, the CPU is charged to the candidate's time.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import select
import struct
import sys
import time

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")
BLOCKED_EVENTS = ("open", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.kill",
                  "os.killpg", "signal.pthread_kill", "subprocess.Popen", "_thread.start_new_thread",
                  "socket.__new__", "socket.connect", "socket.bind", "ctypes.dlopen", "ctypes.dlsym",
                  "ctypes.cdata", "ctypes.call_function", "sys.settrace", "sys.setprofile", "sys._current_frames",
                  "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.chdir", "os.putenv", "os.unsetenv",
                  "mmap.__new__", "import", "compile", "exec", "code.__new__", "function.__new__",
                  "object.__setattr__", "object.__delattr__", "sys.addaudithook", "os.remove", "os.rename",
                  "os.truncate", "shutil.rmtree", "os.listdir", "os.scandir", "glob.glob", "os.walk",
                  "resource.setrlimit", "os.sched_setaffinity", "os.nice", "os.setpriority", "sys._getframe",
                  "sys._getframemodulename", "object.__getattr__", "fcntl.fcntl", "fcntl.ioctl")
MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
                   "MALLOC_TOP_PAD_": str(64 << 20)}
"""glibc's allocator, fixed for both workers: by default its mmap threshold adapts to the sizes a
process has freed, so two workers running the same code could allocate their outputs differently
(fresh pages and their faults, or reused heap) depending on their history: a 1.6x bias measured
between two identical functions."""
ALLOWED_IMPORTS = ("math", "cmath", "itertools", "functools", "operator", "numpy")
"""Modules a candidate may import (loaded, with NumPy's submodules, before its source runs)."""
PRELOADED = ("math", "cmath", "itertools", "functools", "operator", "numpy", "numpy.linalg", "numpy.fft",
             "numpy.random", "numpy.lib.stride_tricks")
TORCH_IMPORTS = ("torch", "triton")
"""Added to :data:`ALLOWED_IMPORTS` for ``framework = "torch"`` (Triton where it is installed)."""
TORCH_PRELOADED = ("torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "HOME")
"""Passed through to the workers for ``device = "cuda"`` (the driver and the toolkit need them)."""
LOW_PRECISION = {"rtol": 2e-2, "atol": 2e-3}
"""An output outside the task's tolerance but within this one is what computing in half precision
(or a lower-precision shortcut) gives: flagged as ``lower-precision`` rather than merely wrong."""
OUTSIDE_CPU_SLACK_S = 0.01
"""CPU seconds a candidate worker may spend outside its timed batches beyond what the reference
worker spent on the same untimed steps (reading commands, digests; interpreter noise) before it is
flagged. Below that it is not free: see :data:`CHARGE_SLACK_S`."""
CHARGE_SLACK_S = 0.0005
"""Untimed CPU seconds per round beyond the reference's that are not charged to the candidate's time
(the two workers' noise on identical untimed steps); every second past it is."""


# ----------------------------------------------------------------------------- framing
def send(stream, message: dict) -> None:
    data = json.dumps(message).encode()
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


class ProtocolError(Exception):
    """A worker's reply that is not a message of the protocol (a candidate writing to the pipe)."""


def receive(fd: int, deadline: float) -> dict:
    """One length-prefixed JSON object from ``fd`` before ``deadline`` (TimeoutError, EOFError,
    ProtocolError)."""
    header = _read_exact(fd, 4, deadline)
    (length,) = struct.unpack("<I", header)
    if length > 16 << 20:
        raise ProtocolError(f"a message of {length} bytes")
    try:
        message = json.loads(_read_exact(fd, length, deadline))
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"a {type(message).__name__}, not an object")
    return message


def _read_exact(fd: int, count: int, deadline: float) -> bytes:
    chunks = b""
    while len(chunks) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, count - len(chunks))
        if not chunk:
            raise EOFError
        chunks += chunk
    return chunks


# ----------------------------------------------------------------------------- worker
class Framework:
    """What a worker's functions take and return: NumPy arrays, or PyTorch tensors on a device.

    Loaded before the candidate's source, so that what the guard lets a candidate import is already
    there, and warmed up, so that thread pools and a device's context exist before the worker's
    thread count is taken (not inside a candidate's first timed batch, where they would look like a
    background thread). The tensor methods the worker converts outputs with are bound from PyTorch's
    C base class here: a candidate can reassign ``torch.Tensor``'s Python attributes, not those.
    """

    def __init__(self, name: str, device: str) -> None:
        import importlib

        for module in PRELOADED:
            importlib.import_module(module)
        import numpy as np

        self.np, self.name, self.device = np, name, device
        self.allowed_imports = ALLOWED_IMPORTS
        self._synchronize = None
        if name != "torch":
            return
        import torch

        for module in TORCH_PRELOADED:
            importlib.import_module(module)
        torch.set_num_threads(1)
        with contextlib.suppress(RuntimeError):  # refused once inter-op work has started
            torch.set_num_interop_threads(1)
        base = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase  # PyTorch < 2.3
        self._tensor, self._from_numpy = torch.Tensor, torch.from_numpy
        self._detach, self._cpu, self._contiguous, self._numpy = base.detach, base.cpu, base.contiguous, base.numpy
        self._to = base.to
        if device != "cpu":
            torch.cuda.init()
            self._synchronize = torch.cuda.synchronize
            with contextlib.suppress(ImportError):
                importlib.import_module("triton")
        square = torch.ones(64, 64, device=device)
        warm = (square @ square).softmax(-1).sum() + torch.nn.functional.gelu(square).mean() + torch.tanh(square).max()
        float(warm)  # waits for the device
        self.allowed_imports = ALLOWED_IMPORTS + TORCH_IMPORTS

    def stage(self, calls: list) -> list:
        """A batch's inputs (NumPy views of the shared memory) as the functions take them: tensors on
        the device, copied there before the timed batch starts."""
        if self.name != "torch":
            return calls
        staged = [[self._to(self._from_numpy(array), self.device) for array in call] for call in calls]
        self.finish()
        return staged

    def watch(self) -> None:
        """Remember the functions the worker's own code runs on (taken just before the candidate's
        source runs): this script's, the standard library's it uses, the framework's, and the tensor
        class's methods. :meth:`tampered` names any the candidate replaced since."""
        names = ["__main__", "builtins", "json", "struct", "os", "math", "mmap", "time", "select", "numpy"]
        if self.name == "torch":
            names += ["torch", "torch.cuda"]
        namespaces = {name: vars(sys.modules[name]) for name in names if name in sys.modules}
        classes = {"Framework": vars(Framework), **({"torch.Tensor": vars(self._tensor)} if self.name == "torch" else {})}
        # Modules gain attributes as they lazily load (only replacing one counts); a class that gains a
        # method shadows its base's (``torch.Tensor.to`` is PyTorch's C base's until assigned).
        self._watched = {name: (namespace, {key: value for key, value in namespace.items() if callable(value)},
                                name in classes) for name, namespace in {**namespaces, **classes}.items()}

    def tampered(self) -> list[str]:
        """What the candidate replaced of what :meth:`watch` remembered, or added to a watched class
        (the worker binds what it needs before the candidate loads; a candidate that tries is flagged
        all the same)."""
        changed = []
        for name, (namespace, before, is_class) in getattr(self, "_watched", {}).items():
            changed += [f"{name}.{key}" for key, value in before.items() if namespace.get(key) is not value]
            if is_class:
                changed += [f"{name}.{key}" for key, value in namespace.items() if key not in before and callable(value)]
        return sorted(changed)[:20]

    def finish(self) -> None:
        """Inside the timed batch, after the last call: wait until the device has done the work."""
        if self._synchronize is not None:
            self._synchronize()

    def as_array(self, output):
        """An output as a NumPy array (on the host), or why it is not one."""
        if self.name != "torch":
            if type(output) is self.np.ndarray:
                return output
            return f"returned {type(output).__name__}, not a numpy.ndarray"
        if type(output) is not self._tensor:
            return f"returned {type(output).__name__}, not a torch.Tensor"
        try:
            array = self._numpy(self._cpu(self._contiguous(self._detach(output))))
        except (TypeError, RuntimeError) as exc:
            return f"a tensor NumPy cannot hold: {exc}"[:200]
        return array if type(array) is self.np.ndarray else f"converted to {type(array).__name__}"


def worker_main(role: str, shm_path: str) -> None:
    """A worker: load one function, then run batches on inputs from the shared-memory file."""
    commands = sys.stdin.fileno()
    setup = receive(commands, time.monotonic() + 60)
    framework = Framework(str(setup.get("framework", "numpy")), str(setup.get("device", "cpu")))
    np = framework.np
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    alarms = os.fdopen(os.dup(sys.stderr.fileno()), "w")  # hook reports; the candidate cannot recall them
    # What the candidate prints goes nowhere: fds 1 and 2 no longer reach the harness.
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    os.close(quiet)
    with open(shm_path, "r+b") as handle:
        shared = mmap.mmap(handle.fileno(), 0)
    namespace: dict = {"__name__": f"relayrl_{role}", "__builtins__": __builtins__}
    source, entry = setup["source"], setup["entry"]
    framework.watch()
    # Both workers are locked down alike (the filter costs each system call the same), before the
    # candidate's source is even compiled.
    unlocked = lock_down(on_device=framework.device != "cpu") if setup.get("lockdown", True) else "not asked"
    try:
        code = compile(source, f"<{role}>", "exec")
        if role == "candidate" and setup.get("guard", True):
            _install_guard(alarms, code, framework.allowed_imports)
        exec(code, namespace)  # the point of the worker
        function = namespace[entry]
        if not callable(function):
            raise TypeError(f"{entry} is not a function")
    except BaseException as exc:  # reported, not raised
        send(replies, {"error": f"{type(exc).__name__}: {exc}"[:2000], "phase": "load"})
        return
    send(replies, {"ready": True, "unlocked": unlocked})
    staged: list = []
    outputs: list = []
    arrays: list = []  # the outputs as host NumPy arrays, made inside the timed batch
    drawn: dict = {}  # the digest weights of this grading's seed, drawn once and extended as outputs grow
    while True:
        try:
            command = receive(commands, time.monotonic() + 3600)
        except (EOFError, TimeoutError):
            return
        if command["op"] == "stage":  # untimed: the inputs, where the functions take them
            staged = framework.stage([[np.frombuffer(shared, dtype=arg["dtype"], count=math.prod(arg["shape"]),
                                                     offset=arg["offset"]).reshape(arg["shape"]) for arg in call]
                                      for call in command["calls"]])
            send(replies, {"staged": True})
        elif command["op"] == "run":  # the timed batch
            outputs, arrays = [], []
            error = None
            try:
                for args in staged:
                    outputs.append(function(*args))
                framework.finish()
                # Inside the timed region: every output becomes host memory now, so that no value is
                # computed later, when it is read (a conversion the candidate hooked runs here, timed).
                arrays = [framework.as_array(output) for output in outputs]
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"[:2000]
            send(replies, {"done": True, "error": error})
        elif command["op"] == "digest":
            tolerance, limit = command["tolerance"], int(command["limit"])
            sizes = [array.size for array in arrays if not isinstance(array, str) and array.size <= limit]
            weights = _weights(np, drawn, int(command["seed"]), max(sizes, default=0))
            send(replies, {"digests": [_digest(np, array, weights, tolerance, limit) for array in arrays],
                           "tampered": framework.tampered()})
        elif command["op"] == "fetch":  # one output, whole, into the fetch region
            output = arrays[command["index"]]
            if isinstance(output, str) or output.nbytes > command["limit"]:
                send(replies, {"error": output if isinstance(output, str) else "an output beyond the size limit"})
                continue
            data = np.ascontiguousarray(output).tobytes()
            shared[command["offset"]:command["offset"] + len(data)] = data
            send(replies, {"shape": list(output.shape), "dtype": output.dtype.str})
        else:
            return


def _weights(np, drawn: dict, seed: int, count: int):
    """The first ``count`` standard normals of ``seed``'s stream (a prefix of any longer draw: both
    workers weigh element ``i`` alike whatever sizes their outputs have)."""
    if drawn.get("seed") != seed or drawn["weights"].size < count:
        drawn.update(seed=seed, weights=np.random.default_rng(seed).standard_normal(max(count, 1 << 12)))
    return drawn["weights"]


def _digest(np, output, weights, tolerance: dict, limit: int) -> dict:
    """An output (a NumPy array, or why the function's output is not one: :meth:`Framework.as_array`)
    as three sums (non-finite values counted apart): weighted by ``weights``, plain, and with
    alternating signs; and each sum's tolerance: its weights, in absolute value, applied to every
    element's ``atol + rtol * |value|``. Only the reference worker's ``bound`` is used.

    Three sums, not one: a single sum of a wrong output lands within the bound of some other call's
    right answer by chance (255 of 100,000 pairs for a slipped chain in the tests, and an output is
    compared with thousands), which flagged an honest wrong answer ``stale-output``. Each unweighted
    sum multiplies that chance by about the same small factor and needs no random draw: eight rows of
    drawn weights, tried first, made the candidate worker of an honest answer look busy outside its
    timed batches (``work-outside-timing``; why only the candidate's is not established)."""
    if isinstance(output, str):
        return {"error": output}
    if output.size > limit:
        return {"error": f"an output of {output.size} elements"}
    flat = output.reshape(-1).astype(np.float64)
    finite = np.isfinite(flat)
    flat[~finite] = 0.0
    allowed = tolerance["atol"] + tolerance["rtol"] * np.abs(flat)
    alternating = float(flat[0::2].sum() - flat[1::2].sum())
    unweighted_bound = float(allowed.sum())  # the plain and the alternating sum: weights of magnitude 1
    return {"shape": list(output.shape), "dtype": output.dtype.str,
            "value": [float(np.dot(flat, weights[:flat.size])), float(flat.sum()), alternating],
            "bound": [float(np.dot(np.abs(weights[:flat.size]), allowed)), unweighted_bound, unweighted_bound],
            "nonfinite": int(flat.size - int(finite.sum()))}


MAX_ALARMS = 32
"""Refusals a candidate worker reports (the first ones): one is enough to flag it."""


def _install_guard(alarms, code, allowed_imports: tuple[str, ...] = ALLOWED_IMPORTS) -> None:
    """Refuse and report what a candidate has no business doing (see the module docstring).

    The hook keeps no state a candidate could switch off: what it allows is fixed when it is made
    (``code``, the candidate's compiled source, is the one code object it may ``exec``). It is
    defence in depth and evidence; what the verdict relies on is the lock-down (:func:`lock_down`)
    and the checks the harness makes from outside the worker."""

    os.set_blocking(alarms.fileno(), False)  # a flood of refusals fills the pipe: never wait on it
    reported = [0]  # the alarms written: evidence enough after the first few dozen

    def hook(event: str, args: tuple) -> None:
        if event not in BLOCKED_EVENTS:
            return
        if event == "exec" and args and args[0] is code:
            return  # the candidate's own source
        if event == "import":
            name = str(args[0])
            if name.split(".")[0] in allowed_imports and name in sys.modules:
                return
        if event == "open" and isinstance(args[0], str) and args[0].startswith("<"):
            return  # a traceback looking for the source of "<candidate>": there is no such file
        if event == "object.__setattr__" and not isinstance(args[0], type(sys)):
            return  # setting attributes of the candidate's own objects and classes is fine
        reported[0] += 1
        if reported[0] <= MAX_ALARMS:
            try:
                alarms.write(json.dumps({"event": event, "detail": repr(args)[:300]}) + "\n")
                alarms.flush()
            except Exception:  # the alarm is best effort; the refusal is not
                pass
        raise PermissionError(f"the kernel sandbox does not allow {event}")

    sys.addaudithook(hook)

    # Thread starts raise no audit event before Python 3.13: refuse them at the source as well.
    import _thread
    import threading

    def refuse_thread(*args, **kwargs):
        hook("_thread.start_new_thread", args)

    _thread.start_new_thread = _thread.start_new = refuse_thread
    threading._start_new_thread = refuse_thread
    if hasattr(threading, "_start_joinable_thread"):
        threading._start_joinable_thread = refuse_thread


# ----------------------------------------------------------------------------- lock-down
AUDIT_ARCH_X86_64 = 0xC000003E
SYSCALLS_X86_64 = {
    "kill": 62, "tgkill": 234, "tkill": 200, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "process_madvise": 440, "migrate_pages": 256, "move_pages": 279,
    "sched_setaffinity": 203, "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314,
    "setpriority": 141, "ioprio_set": 251, "prlimit64": 302, "setrlimit": 160,
    "clone": 56, "clone3": 435, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "unshare": 272, "setns": 308,
    "socket": 41, "socketpair": 53, "connect": 42, "bind": 49,
    "setitimer": 38, "alarm": 37, "timer_create": 222, "io_setup": 206, "io_submit": 209, "io_uring_setup": 425,
    "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "mount": 165, "fcntl": 72, "ioctl": 16, "capset": 126,
    "open": 2, "creat": 85, "openat": 257, "openat2": 437, "open_by_handle_at": 304, "truncate": 76,
    "unlink": 87, "unlinkat": 263, "rename": 82, "renameat": 264, "renameat2": 316, "rmdir": 84, "mkdir": 83,
    "mkdirat": 258, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "chmod": 90, "fchmodat": 268,
    "chown": 92, "fchownat": 260, "lchown": 94, "mknod": 133, "mknodat": 259,
}
"""System call numbers of x86-64 (``asm/unistd_64.h``). The lock-down is built for this
architecture only: elsewhere it reports that it could not be made, and no speed-up is paid."""
DENIED_SYSCALLS = ("tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "pidfd_send_signal",
                   "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "process_madvise",
                   "migrate_pages", "move_pages", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                   "sched_setattr", "setpriority", "ioprio_set", "setrlimit", "fork", "vfork", "execve", "execveat",
                   "unshare", "setns", "socket", "socketpair", "connect", "bind", "setitimer", "alarm",
                   "timer_create", "io_setup", "io_submit", "io_uring_setup", "perf_event_open", "bpf",
                   "userfaultfd", "mount")
"""Refused outright (EPERM): reaching another process (signals, tracing, its memory, its scheduling
or limits), making one (or a thread, see :func:`seccomp_program`), the network, timers that would run
the worker's code later, and asynchronous I/O that kernel threads would do on the worker's behalf
(CPU the worker's accounting would not see)."""
PATH_SYSCALLS = ("open", "creat", "openat", "openat2", "open_by_handle_at", "truncate", "unlink", "unlinkat",
                 "rename", "renameat", "renameat2", "rmdir", "mkdir", "mkdirat", "link", "linkat", "symlink",
                 "symlinkat", "chmod", "fchmodat", "chown", "fchownat", "lchown", "mknod", "mknodat")
"""Opening or changing anything by path: refused to a worker on the CPU, which has opened all it needs
before it loads a function (its pipes, its shared memory). No file of the host, of the sandbox or of
another process (``/proc/PID/...``) is then within reach, whatever the sandbox's view shows. A
worker on a GPU keeps them: the CUDA libraries load parts of themselves on first use."""
F_SETOWN, F_SETSIG, F_SETOWN_EX, FIOSETOWN, SIOCSPGRP = 8, 10, 15, 0x8901, 0x8902
"""``fcntl``/``ioctl`` commands that make the kernel signal another process when a file is ready."""


def seccomp_program(own_pid: int, allow_threads: bool, allow_files: bool = False) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp filter (``(code, jt, jf, k)`` instructions) for a worker of ``own_pid``.

    Every refusal is EPERM, so a refused call is an ordinary ``PermissionError`` in Python. ``clone3``
    gets ENOSYS (glibc then falls back to ``clone``, whose flags a filter can read); ``clone`` is
    allowed for a thread (``CLONE_THREAD``) only when ``allow_threads`` (a CUDA runtime starts threads
    of its own), never for a process. Unless ``allow_files``, :data:`PATH_SYSCALLS` are refused too."""
    load, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    numbers = SYSCALLS_X86_64
    program = [(load, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH_X86_64), (ret, 0, 0, eperm),  # another ABI: refused
               (load, 0, 0, 0), (0x35, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # the x32 ABI: refused
    for name in DENIED_SYSCALLS + (() if allow_files else PATH_SYSCALLS):
        program += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys)]

    def on_argument(name: str, index: int, values: tuple[int, ...], inside: int, outside: int) -> list:
        """``name``'s argument ``index`` (its low 32 bits) among ``values``: ``inside``, else ``outside``."""
        block = [(jeq, 0, len(values) + 3, numbers[name]), (load, 0, 0, 16 + 8 * index)]
        block += [(jeq, len(values) - position, 0, value) for position, value in enumerate(values)]
        return [*block, (ret, 0, 0, outside), (ret, 0, 0, inside)]

    program += on_argument("kill", 0, (own_pid,), allow, eperm)
    program += on_argument("tgkill", 0, (own_pid,), allow, eperm)
    program += on_argument("prlimit64", 0, (0, own_pid), allow, eperm)
    program += on_argument("fcntl", 1, (F_SETOWN, F_SETSIG, F_SETOWN_EX), eperm, allow)
    program += on_argument("ioctl", 1, (FIOSETOWN, SIOCSPGRP), eperm, allow)
    if allow_threads:
        program += [(jeq, 0, 4, numbers["clone"]), (load, 0, 0, 16), (jset, 0, 1, 0x00010000),
                    (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    else:
        program += [(jeq, 0, 1, numbers["clone"]), (ret, 0, 0, eperm)]
    return [*program, (ret, 0, 0, allow)]


def lock_down(on_device: bool) -> str | None:
    """Make this worker unreachable and unable to reach: not dumpable (no other process of its uid
    reads or writes its memory through ``/proc``), no capabilities (so root cannot override that
    either), and a seccomp filter (:func:`seccomp_program`). The kernel enforces all three whatever
    the worker runs next, so a candidate that gets past the audit hook (or switches it off) still
    cannot stop, trace, out-core or offload anything. None when done, else why not (one line)."""
    import platform

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"the worker lock-down is built for Linux on x86-64, not {sys.platform} on {platform.machine()}"
    try:
        import ctypes
    except ImportError as exc:
        return f"ctypes is missing: {exc}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 0
            return f"PR_SET_DUMPABLE failed (errno {ctypes.get_errno()})"
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        empty = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice (64 capability bits)
        if libc.syscall(SYSCALLS_X86_64["capset"], header, empty) != 0:
            return f"dropping capabilities failed (errno {ctypes.get_errno()})"
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return f"PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
        instructions = seccomp_program(os.getpid(), allow_threads=on_device, allow_files=on_device)

        class SockFilter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                        ("k", ctypes.c_uint32)]

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

        filters = (SockFilter * len(instructions))(*[SockFilter(*item) for item in instructions])
        program = SockFprog(len(instructions), filters)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        if libc.prctl(22, 2, ctypes.addressof(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            return f"installing the seccomp filter failed (errno {ctypes.get_errno()})"
        return None
    finally:
        for name in [name for name in sys.modules if name == "ctypes" or name.startswith("ctypes.")]:
            del sys.modules[name]  # a candidate's ``import ctypes`` is a new import, refused by the hook


def static_flags(source: str) -> list[dict]:
    """Exploit attempts visible in the candidate's source: assigning to (or deleting) an attribute
    of an imported module, directly or through ``setattr``/``delattr`` (patching a timer, NumPy, the
    harness through ``sys.modules``...). Audit hooks do not see module attributes change."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
                for name in [alias.asname or alias.name] if alias.name in ("sys", "os", "time", "builtins")}

    def root(node) -> str | None:
        while True:
            if isinstance(node, (ast.Attribute, ast.Subscript)):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and node.args:
                node = node.args[0]  # getattr(torch, "Tensor")
            else:
                return node.id if isinstance(node, ast.Name) else None

    flags = []
    for node in ast.walk(tree):
        targets: list = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for item in ast.walk(target):
                if isinstance(item, (ast.Attribute, ast.Subscript)) and isinstance(item.ctx, (ast.Store, ast.Del)) \
                        and root(item) in modules:
                    flags.append({"detector": "patches-module",
                                  "evidence": f"line {node.lineno}: {ast.unparse(item)[:120]} is assigned"})
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and root(node.args[0]) in modules:
            flags.append({"detector": "patches-module",
                          "evidence": f"line {node.lineno}: {ast.unparse(node)[:120]}"})
    return flags



# ----------------------------------------------------------------------------- harness
class Flagged(Exception):
    """An exploit attempt, with the detector's name and its evidence."""

    def __init__(self, detector: str, evidence: str) -> None:
        super().__init__(f"{detector}: {evidence}")
        self.detector, self.evidence = detector, evidence


class Incorrect(Exception):
    """The candidate's output is not the reference's (shape, dtype, values beyond tolerance)."""


class Worker:
    """A worker process seen from the harness: its pipes, its shared memory, its CPU accounting."""

    def __init__(self, role: str, harness_source: str, source: str, entry: str, shm_bytes: int, core: int | None,
                 deadline: float, guard: bool = True, framework: str = "numpy", device: str = "cpu",
                 lockdown: bool = True) -> None:
        import subprocess

        self.role = role
        self.shm_path = f"/dev/shm/relayrl-kernel-{role}-{os.urandom(8).hex()}"
        with open(self.shm_path, "wb") as handle:
            handle.truncate(shm_bytes)
        with open(self.shm_path, "r+b") as handle:
            self.shared = mmap.mmap(handle.fileno(), shm_bytes)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0",
               **{name: "1" for name in THREAD_VARIABLES}, **MALLOC_SETTINGS}
        if device != "cpu":
            env.update({name: os.environ[name] for name in DEVICE_VARIABLES if name in os.environ})
        pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        self.process = subprocess.Popen([sys.executable, "-I", "-c", harness_source, "worker", role, self.shm_path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=env, preexec_fn=pin)
        os.set_blocking(self.process.stderr.fileno(), False)
        self.stderr_text = ""
        send(self.process.stdin, {"source": source, "entry": entry, "guard": guard, "framework": framework,
                                  "device": device, "lockdown": lockdown})
        self.loaded = receive(self.process.stdout.fileno(), deadline)
        if os.path.exists(self.shm_path):  # mapped by now: nobody else opens it
            os.unlink(self.shm_path)
        self.threads = self.thread_count()

    def request(self, message: dict, deadline: float) -> dict:
        send(self.process.stdin, message)
        return receive(self.process.stdout.fileno(), deadline)

    def cpu_seconds(self) -> float:
        """CPU time of every thread of the worker and of every process below it (nanosecond clock)."""
        return sum(_cpu_of(pid) for pid in [self.process.pid, *_descendants(self.process.pid)])

    def thread_count(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.process.pid}/task"))
        except OSError:
            return 0

    def alarms(self) -> list[dict]:
        """What the worker's audit hook refused, as it reported it on stderr."""
        try:
            while chunk := os.read(self.process.stderr.fileno(), 65536):
                self.stderr_text += chunk.decode(errors="replace")
        except (BlockingIOError, OSError):
            pass
        found = []
        for line in self.stderr_text.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and "event" in item:
                found.append(item)
        return found

    def close(self) -> None:
        try:
            self.process.kill()
            self.process.wait(5)
        except Exception:  # closing is best effort
            pass
        if os.path.exists(self.shm_path):
            os.unlink(self.shm_path)


def _cpu_of(pid: int) -> float:
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def _descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """Processes below ``root``; with the harness a child subreaper, orphans stay below it too."""
    parents = _parents() if parents is None else parents
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _become_subreaper_and_undumpable() -> None:
    """Orphans of the candidate's processes reparent to the harness (so they stay countable), and no
    other process of this uid can read the harness's memory through /proc."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:  # best effort: the other checks stand alone
        pass


def _dims(arg: dict, sizes: dict) -> list[int]:
    return [int(sizes[dim]) if isinstance(dim, str) else int(dim) for dim in arg["shape"]]


def _inputs(np, rng, args: list[dict], sizes: dict) -> list:
    arrays = []
    for arg in args:
        dtype = np.dtype(arg.get("dtype", "float32"))
        low, high = arg.get("low", -1.0), arg.get("high", 1.0)
        if dtype.kind in "iu":
            arrays.append(rng.integers(int(low), int(high), size=_dims(arg, sizes), dtype=dtype))
        elif dtype in (np.float32, np.float64):
            array = rng.random(size=_dims(arg, sizes), dtype=dtype)
            array *= high - low
            array += low
            arrays.append(array)
        else:
            arrays.append(rng.uniform(low, high, size=_dims(arg, sizes)).astype(dtype))
    return arrays


class Session:
    """One grading: both workers, the inputs, the clock and every check (see the module docstring)."""

    def __init__(self, job: dict) -> None:
        import numpy as np

        self.np = np
        self.job = job
        self.deadline = time.monotonic() + float(job.get("timeout_s", 120))
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
        self.tolerance = job.get("tolerance", {"rtol": 1e-5, "atol": 1e-6})
        self.largest = max(sum(math.prod(_dims(arg, sizes)) * np.dtype(arg.get("dtype", "float32")).itemsize
                               for arg in job["args"]) for sizes in job["sizes"])
        # Calls per timed batch: enough that a batch outlasts the clock's and the pipe's noise, few
        # enough that every call's fresh inputs fit in the shared memory (set after calibration).
        self.max_calls = max(1, min(int(job.get("max_calls_per_batch", 256)),
                                    int(job.get("max_shared_bytes", 256 << 20)) // (2 * self.largest + 1)))
        self.calls_per_batch = 1
        self.weights_count = max(1 << 12, 4 * self.largest)  # outputs with more elements are refused
        self.fetch_bytes = max(1 << 20, 4 * self.largest)
        self.fetch_offset = self.max_calls * (self.largest + 64 * len(job["args"]))
        self.shm_bytes = self.fetch_offset + self.fetch_bytes
        cores = sorted(os.sched_getaffinity(0))
        self.core = cores[-1]
        if len(cores) > 1:  # the harness keeps off the workers' core
            os.sched_setaffinity(0, set(cores[:-1]))
        self.workers: list[Worker] = []
        # One weights seed for the session, so that digests of different calls compare.
        self.weights_seed = int(self.rng.integers(1 << 62))
        self.seen: list[dict] = []
        self.disturbed = 0  # rounds whose reference ran far longer than its CPU time

    def start(self, role: str, source: str, entry: str) -> Worker:
        # ``python_guard: false`` is for tests of the operating-system checks alone (a candidate that
        # got past the audit hook, as compiled code could).
        worker = Worker(role, self.job["harness_source"], source, entry, self.shm_bytes, self.core, self.deadline,
                        guard=bool(self.job.get("python_guard", True)), framework=str(self.job.get("framework", "numpy")),
                        device=str(self.job.get("device", "cpu")), lockdown=bool(self.job.get("lockdown", True)))
        self.workers.append(worker)
        return worker

    def place(self, worker: Worker, calls: list[list]) -> list[list[dict]]:
        """Write ``calls`` (lists of arrays) into the worker's shared memory; their descriptors."""
        np = self.np
        offset, layout = 0, []
        for call in calls:
            described = []
            for array in call:
                data = np.ascontiguousarray(array)
                np.frombuffer(worker.shared, dtype=np.uint8, count=data.nbytes, offset=offset)[:] = \
                    data.reshape(-1).view(np.uint8)
                described.append({"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset})
                offset += (data.nbytes + 63) // 64 * 64
            layout.append(described)
        return layout

    def digests(self, worker: Worker) -> list[dict]:
        reply = worker.request({"op": "digest", "seed": self.weights_seed, "limit": self.weights_count,
                                "tolerance": self.tolerance}, self.deadline)
        digests = reply.get("digests")
        if not isinstance(digests, list):
            raise ProtocolError(f"the {worker.role} answered a digest request with something else")
        tampered = reply.get("tampered")
        if tampered and worker.role == "candidate":
            raise Flagged("patches-module", f"the {worker.role} changed {', '.join(map(str, tampered))[:300]}")
        return digests

    def fetch(self, worker: Worker, index: int):
        """Output ``index`` of the worker's last batch, copied out of its fetch region; or why not."""
        np = self.np
        reply = worker.request({"op": "fetch", "index": index, "offset": self.fetch_offset,
                                "limit": self.fetch_bytes}, self.deadline)
        if "error" in reply:
            return str(reply["error"])[:200]
        try:
            dtype = np.dtype(str(reply["dtype"]))
            shape = [int(dim) for dim in reply["shape"]]
        except (KeyError, TypeError, ValueError):
            raise ProtocolError(f"the {worker.role} described an output as {str(reply)[:100]}") from None
        count = math.prod(shape)
        if dtype.kind not in "biufc" or min(shape, default=1) < 0 or count * dtype.itemsize > self.fetch_bytes:
            return f"an output of dtype {dtype} and shape {shape}"
        return np.frombuffer(worker.shared, dtype=dtype, count=count, offset=self.fetch_offset).reshape(shape).copy()

    def timed_seconds(self, in_batch: dict[str, float], wall: dict[str, float], outside: dict[str, float]) -> dict:
        """Each worker's time for its batch, as the speed-up compares them.

        On the CPU, a worker's time is the CPU its threads ran inside the timed batch (the kernel's
        account, read from ``/proc`` by the harness): time it spent stopped, or waiting while the
        core ran something else, is not in it, so nothing that disturbs a worker's core makes the
        reference look slower. On a device the CPU waits for, it is the wall time (the round trip).
        The candidate is charged, on top, every CPU second it spent outside its batch beyond what the
        reference spent on the same untimed steps: work moved to staging, to the digests, to a
        finaliser, or left running after a reply forged before the batch ended, is counted as if timed.
        A round in which the reference's wall time far exceeds its CPU time is counted as disturbed
        (reported; on the CPU its time stands, as measured by its CPU)."""
        by_cpu = self.job.get("device", "cpu") == "cpu"
        seconds = {role: (in_batch[role] if by_cpu else wall[role]) for role in in_batch}
        seconds["candidate"] += max(0.0, outside["candidate"] - outside["reference"] - CHARGE_SLACK_S)
        if by_cpu and wall["reference"] > 1.5 * in_batch["reference"] + 0.002:  # on a device the CPU may idle
            self.disturbed += 1
        return seconds

    def check_whole(self, reference: Worker, candidate: Worker, index: int, sizes: dict,
                    outputs: tuple | None = None) -> None:
        """Compare output ``index`` of both workers element by element (Incorrect, or Flagged when only
        a lower precision explains the difference); ``outputs``: both, already fetched."""
        np = self.np
        expected, got = outputs or (self.fetch(reference, index), self.fetch(candidate, index))
        if isinstance(expected, str):
            raise RuntimeError(f"the reference's output: {expected}")
        if isinstance(got, str):
            raise Incorrect(f"call {index}: {got} (sizes {sizes})")
        if got.shape != expected.shape:
            raise Incorrect(f"output shape {got.shape}, expected {expected.shape} (sizes {sizes})")
        if got.dtype != expected.dtype:
            raise Incorrect(f"output dtype {got.dtype}, expected {expected.dtype} (sizes {sizes})")
        if expected.dtype.kind not in "fc":
            if not np.array_equal(got, expected):
                raise Incorrect(f"outputs differ from the reference's (sizes {sizes})")
            return
        same_nan = np.array_equal(np.isnan(got), np.isnan(expected))
        same_inf = np.array_equal(np.where(np.isinf(expected), expected, 0), np.where(np.isinf(got), got, 0))
        if not (same_nan and same_inf):
            raise Incorrect(f"non-finite values where the reference's differ (sizes {sizes})")
        finite = np.isfinite(expected)
        wide_got, wide_expected = got[finite].astype(np.float64), expected[finite].astype(np.float64)
        error = np.abs(wide_got - wide_expected)
        magnitude = np.abs(wide_expected)
        if np.all(error <= self.tolerance["atol"] + self.tolerance["rtol"] * magnitude):
            return
        worst = float(error.max(initial=0.0))
        if np.all(error <= LOW_PRECISION["atol"] + LOW_PRECISION["rtol"] * magnitude):
            raise Flagged("lower-precision", f"call {index}: outputs within a lower precision's error (max "
                                             f"{worst:.3g}) but outside the task's tolerance (sizes {sizes})")
        raise Incorrect(f"values differ from the reference's beyond the tolerance (max error {worst:.3g}, "
                        f"sizes {sizes})")

    def batch(self, reference: Worker, candidate: Worker, sizes: dict, count: int, candidate_first: bool,
              whole: int | None = None) -> dict:
        """``count`` calls on fresh inputs, one timed batch per worker, outputs compared; wall seconds.

        Every output is compared by digest; ``whole`` of them (all when None), drawn after the
        batch ran, also element by element.

        CPU accounting: each worker's CPU time is read around its timed batch and around the whole
        cycle; what the candidate spends outside its batch must not exceed what the reference spends
        on the same untimed steps, plus a little slack.
        """
        np = self.np
        calls = [_inputs(np, self.rng, self.job["args"], sizes) for _ in range(count)]
        # The cycle, for the CPU accounting, starts before the inputs are staged: a worker's every CPU
        # second from here to its last output read is either in its timed batch or charged to it.
        cycle_start = {worker.role: worker.cpu_seconds() for worker in (reference, candidate)}
        layouts = {worker.role: self.place(worker, calls) for worker in (reference, candidate)}
        for worker in (reference, candidate):  # untimed: inputs where the functions take them (a device)
            if worker.request({"op": "stage", "calls": layouts[worker.role]}, self.deadline).get("staged") is not True:
                raise ProtocolError(f"the {worker.role} answered a staging request with something else")
        in_batch: dict[str, float] = {}
        wall: dict[str, float] = {}
        for worker in ((candidate, reference) if candidate_first else (reference, candidate)):
            threads_before = worker.thread_count()
            cpu_before = worker.cpu_seconds()
            started = time.perf_counter()
            reply = worker.request({"op": "run"}, self.deadline)
            wall[worker.role] = time.perf_counter() - started
            if reply.get("done") is not True:
                raise ProtocolError(f"the {worker.role} answered a batch with something else")
            in_batch[worker.role] = worker.cpu_seconds() - cpu_before
            if reply.get("error"):
                raise RuntimeError(f"the {worker.role} raised: {reply['error']}")
            if worker is candidate and worker.thread_count() > max(threads_before, worker.threads):
                raise Flagged("background-thread", f"the candidate's process went from {worker.threads} to "
                                                   f"{worker.thread_count()} threads")
        found = {worker.role: self.digests(worker) for worker in (reference, candidate)}
        drawn = [] if whole is None else sorted(int(index) for index in
                                                self.rng.choice(count, size=min(whole, count), replace=False))
        # Read now, inside the accounted cycle; compared below.
        fetched = {index: (self.fetch(reference, index), self.fetch(candidate, index)) for index in drawn}
        outside = {worker.role: worker.cpu_seconds() - cycle_start[worker.role] - in_batch[worker.role]
                   for worker in (reference, candidate)}
        if outside["candidate"] > 2 * outside["reference"] + OUTSIDE_CPU_SLACK_S:
            raise Flagged("work-outside-timing", f"the candidate used {outside['candidate']:.4f} CPU s outside its "
                                                 f"timed batch, the reference {outside['reference']:.4f}")
        seconds = self.timed_seconds(in_batch, wall, outside)
        if _descendants(candidate.process.pid):
            raise Flagged("extra-process", "the candidate started a process")
        strays = [pid for pid in _descendants(os.getpid()) if pid not in {w.process.pid for w in self.workers}]
        if strays:
            raise Flagged("extra-process", f"{len(strays)} process(es) under the harness that are not its workers")
        if len(found["candidate"]) != count:
            raise Incorrect(f"{len(found['candidate'])} outputs for {count} calls")
        wrong = None
        for index, (expected, got) in enumerate(zip(found["reference"], found["candidate"])):
            if "error" in expected:
                raise RuntimeError(f"the reference's output: {expected['error']}")
            why = self.compare(expected, got)
            if why is not None:
                others = self.seen + found["reference"][:index] + found["reference"][index + 1:]
                if any(self.compare(seen, got) is None for seen in others):
                    # the right answer to another call: a cache, or outputs computed ahead
                    raise Flagged("stale-output", f"call {index} returned the output of an earlier call "
                                                  f"(sizes {sizes})")
                wrong = wrong or f"call {index}: {why} (sizes {sizes})"
        self.seen = (self.seen + found["reference"])[-4096:]
        # Element by element: all calls, or ``whole`` drawn now that the batch has run. Before a
        # digest's verdict, so that a lower precision is named as such.
        for index in (range(count) if whole is None else drawn):
            self.check_whole(reference, candidate, index, sizes, fetched.get(index))
        if wrong:
            raise Incorrect(wrong)
        return seconds

    @staticmethod
    def compare(expected: dict, got: object) -> str | None:
        """Why the candidate's digest ``got`` is not the reference's within tolerance, or None.

        If every element is within ``atol + rtol * |reference|``, the weighted sums differ by at most
        the same weights applied to those bounds, so the digest test never fails a correct candidate.
        It is a coarse test (independent errors cancel in a sum, so outputs somewhat outside the
        tolerance can pass it): it catches answers that are wrong outright on every call, and the
        element-by-element checks of calls drawn after each batch catch the rest.
        """
        if not isinstance(got, dict):
            return "a malformed digest"
        if "error" in got:
            return got["error"]
        if got["shape"] != expected["shape"]:
            return f"output shape {tuple(got['shape'])}, expected {tuple(expected['shape'])}"
        if got["dtype"] != expected["dtype"]:
            return f"output dtype {str(got['dtype'])[:20]!r}, expected {expected['dtype']!r}"
        values = got.get("value")
        if (not isinstance(values, list) or len(values) != len(expected["value"])
                or not all(isinstance(value, (int, float)) for value in values)
                or not isinstance(got.get("nonfinite"), int)):
            return "a malformed digest"
        if got["nonfinite"] != expected["nonfinite"]:
            return f"{got['nonfinite']} non-finite values, the reference has {expected['nonfinite']}"
        for value, right, bound in zip(values, expected["value"], expected["bound"]):
            if not abs(float(value) - right) <= bound + 1e-12 * (1 + abs(right)):
                return "values differ from the reference's beyond the tolerance"
        return None

    def close(self) -> None:
        """Stop the workers and every process left below the harness (orphans reparent to it)."""
        import signal

        for worker in self.workers:
            worker.close()
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def grade(job: dict) -> dict:
    """Grade one job (fields: :func:`relayrl.environments.kernels.grading.harness_job`); the report."""
    _become_subreaper_and_undumpable()
    report: dict = {"status": "ok", "correct": False, "speedup": None, "flags": [], "message": ""}
    session = Session(job)
    candidate = None
    try:
        reference = session.start("reference", job["reference"], job.get("reference_entry", "reference"))
        if "error" in reference.loaded:
            raise RuntimeError(f"the reference does not load: {reference.loaded['error']}")
        if job.get("python_guard", True):
            report["flags"] += static_flags(job["candidate"])
        if report["flags"]:
            return report
        candidate = session.start("candidate", job["candidate"], job.get("entry", "kernel"))
        if "error" in candidate.loaded:
            report.update(status="load_error", message=candidate.loaded["error"])
            return report
        for sizes in job["sizes"]:  # correctness first, on every size, on fresh inputs
            session.batch(reference, candidate, sizes, int(job.get("correctness_calls", 2)), candidate_first=False)
        report["correct"] = True
        if not job.get("time", True):
            return report
        unlocked = [f"{worker.role}: {worker.loaded['unlocked']}" for worker in (reference, candidate)
                    if worker.loaded.get("unlocked")]
        if unlocked:  # fail closed: a speed-up measured without the lock-down could be bent
            report["message"] = f"no speed-up measured: the workers could not be locked down ({'; '.join(unlocked)})"
            return report
        # Calibration: the reference's time per call sets how many calls a batch takes.
        probe = session.batch(reference, candidate, job["sizes"][-1], 2, candidate_first=False, whole=1)
        per_call = max(probe["reference"] / 2, 1e-7)
        session.calls_per_batch = max(1, min(session.max_calls, math.ceil(float(job.get("batch_s", 0.01)) / per_call)))
        rounds, warmup = int(job.get("rounds", 10)), int(job.get("warmup_rounds", 1))
        if probe["candidate"] > 10 * probe["reference"]:  # far slower: its speed-up is < 1 however measured
            rounds, warmup = min(rounds, 3), 0
        samples: dict[str, list[float]] = {"reference": [], "candidate": []}
        for index in range(warmup + rounds):
            try:
                seconds = session.batch(reference, candidate, job["sizes"][-1], session.calls_per_batch,
                                        candidate_first=bool(index % 2), whole=2)
            except Incorrect as exc:  # right when checked, wrong when timed: it told the two apart
                raise Flagged("inconsistent-outputs", f"timed outputs differ from the checked ones: {exc}") from exc
            if index >= warmup:
                for role, value in seconds.items():
                    samples[role].append(value)
        ratios = sorted(r / c for r, c in zip(samples["reference"], samples["candidate"]))
        reference_s, candidate_s = _median(samples["reference"]), _median(samples["candidate"])
        report.update(speedup=reference_s / candidate_s, speedup_q1=ratios[len(ratios) // 4],
                      speedup_q3=ratios[(3 * len(ratios)) // 4], rounds=rounds,
                      reference_call_s=reference_s / session.calls_per_batch,
                      candidate_call_s=candidate_s / session.calls_per_batch, disturbed_rounds=session.disturbed)
        return report
    except Incorrect as exc:
        report.update(status="incorrect", correct=False, message=str(exc))
        return report
    except Flagged as flag:
        report["flags"].append({"detector": flag.detector, "evidence": flag.evidence})
        return report
    except TimeoutError:
        report.update(status="timeout", correct=False, message="a worker did not answer in time")
        return report
    except EOFError:
        report.update(status="crashed", correct=False, message="a worker died")
        return report
    except ProtocolError as exc:
        report["flags"].append({"detector": "protocol-tampering", "evidence": str(exc)[:400]})
        return report
    except RuntimeError as exc:
        report.update(status="runtime_error", correct=False, message=str(exc)[:2000])
        return report
    finally:
        if candidate is not None:
            for alarm in candidate.alarms():
                report["flags"].append({"detector": "forbidden-operation",
                                        "evidence": f"{alarm['event']} {alarm.get('detail', '')}"[:400]})
            if report["status"] != "ok" or report["flags"]:
                report["stderr"] = "\n".join(line for line in candidate.stderr_text.splitlines()
                                             if not line.startswith('{"event"'))[-2000:]
        session.close()
        if report["flags"]:
            report.update(status="exploit", correct=False, speedup=None)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "worker":
        worker_main(argv[1], argv[2])
        return 0
    sys.stdout.write(json.dumps(grade(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
