"""The ``ray`` launcher: each process of a run inside a Ray actor, placed by the role's resources.

Ray places; relayrl supervises. Every process (a trainer rank, an engine server, the node mirror,
the rollout manager) runs as a child of a :class:`ProcessHost` actor on the node Ray chose for the
role's resources (``[launcher.options] roles``); trainer ranks share one placement group, so they
are scheduled together or not at all. Deaths are answered by relayrl's own launcher exactly as on
one machine (:mod:`relayrl.cli.run.launcher`): a process that exits, an actor killed, or a node
lost all read as that process having died, and the launcher places a new actor for it, which Ray
puts wherever the resources are (a lost node's roles move to the remaining nodes). Actors are
created with ``max_restarts=0`` on purpose: a restart Ray made behind the launcher's back would skip
its order (engines before the rollout process), its restart limits and its events.

The actor's child gets SIGTERM when the actor's worker process dies (``PR_SET_PDEATHSIG``), so an
actor killed or a node stopped takes its process with it. Processes read and write the run
directory by path: on a real cluster it must be on storage every node mounts (or the bus on
``[store] url``), as for the manual multi-host set-up in ``docs/deploy.md``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from relayrl.cli.run.launcher import RunFailed, die_with_parent
from relayrl_ray.config import RayLauncherOptions

__all__ = ["ProcessHost", "RayBackend", "RayProcess", "RaySlot"]

CALL_TIMEOUT_S = 30.0
"""How long a call to a live actor may take before it counts as unanswered."""


class _Host:
    """One process on this node, run for the launcher (the body of the :class:`ProcessHost` actor).

    Every method returns at once (the actor serves one call at a time): the launcher polls.
    """

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None

    def where(self) -> dict[str, Any]:
        return {"host": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid()}

    def free_port(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind((ray.util.get_node_ip_address(), 0))
            return int(sock.getsockname()[1])

    def start(self, argv: Sequence[str], log_path: str, env: Mapping[str, str], capture_stdout: bool) -> int:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE if capture_stdout else self._log,
                                        stderr=self._log, stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                        start_new_session=True, preexec_fn=die_with_parent)
        if capture_stdout:
            threading.Thread(target=self._pump, name="stdout", daemon=True).start()
        return self.process.pid

    def _pump(self) -> None:
        """Copy the child's stdout to its log, keeping the ``READY <port>`` line's port."""
        assert self.process is not None and self.process.stdout is not None and self._log is not None
        for line in iter(self.process.stdout.readline, b""):
            if self._port is None and line.startswith(b"READY "):
                self._port = int(line.split()[1])
                continue
            self._log.write(line)
            self._log.flush()

    def ready(self) -> int | None:
        return self._port

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self._log is not None:
            self._log.close()
        return self.process.returncode


ProcessHost = ray.remote(max_restarts=0, max_task_retries=0)(_Host)
"""The actor every process of a run lives in (see the module docstring)."""


class RayProcess:
    """A process in a :class:`ProcessHost` actor (the launcher's :class:`~relayrl.cli.hookspecs.RoleProcess`)."""

    def __init__(self, name: str, actor: Any, log_path: Path, env: dict[str, str], pid: int, node: str) -> None:
        self.name, self.actor, self.log_path, self.env = name, actor, log_path, env
        self.restarts = 0
        self.node = node
        self._pid: int | None = pid
        self._status: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self._status is not None else self._pid

    def _call(self, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)

    def poll(self) -> int | None:
        if self._status is not None:
            return self._status
        try:
            status = self._call("poll")
        except RayActorError:  # the actor, or its node, is gone: its process went with it
            status = -signal.SIGKILL
        except GetTimeoutError:  # busy or unreachable for now: ask again on the next tick
            return None
        self._status = status
        return status

    def read_ready(self, timeout_s: float, on_wait: Callable[[], None] = lambda: None) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                port = self._call("ready")
            except RayActorError:
                port = None
            if port is not None:
                return int(port)
            status = self.poll()
            if status is not None or time.monotonic() > deadline:
                raise RunFailed(f"{self.name} did not start on {self.node} (see {self.log_path}): "
                                f"{'exited with ' + str(status) if status is not None else 'timed out'}")
            on_wait()
            time.sleep(0.2)

    def terminate(self) -> None:
        if self._status is None:
            with contextlib.suppress(RayActorError):
                self.actor.terminate.remote()

    def wait(self, timeout_s: float) -> None:
        try:
            status = self._call("wait", timeout_s, timeout_s=timeout_s + CALL_TIMEOUT_S)
            if self._status is None:
                self._status = status
        except (RayActorError, GetTimeoutError):
            if self._status is None:
                self._status = -signal.SIGKILL
        with contextlib.suppress(Exception):
            ray.kill(self.actor)  # frees its resources for the process placed after it


class RaySlot:
    """A :class:`ProcessHost` actor placed and waiting for its process."""

    def __init__(self, actor: Any, where: dict[str, Any], forward: dict[str, str]) -> None:
        self.actor = actor
        self.host: str = where["host"]
        self.where = where
        self.forward = forward

    def free_port(self) -> int:
        return int(ray.get(self.actor.free_port.remote(), timeout=CALL_TIMEOUT_S))

    def start(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str], *,
              capture_stdout: bool = False) -> RayProcess:
        merged = {**self.forward, **env}
        try:
            pid = ray.get(self.actor.start.remote(list(argv), str(log_path), merged, capture_stdout),
                          timeout=CALL_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as exc:  # its node went away between placing and starting
            with contextlib.suppress(Exception):
                ray.kill(self.actor)
            raise RunFailed(f"{name} could not start on {self.host}: {type(exc).__name__}") from None
        return RayProcess(name, self.actor, log_path, dict(env), pid, f"{self.host} node {self.where['node_id'][:12]}")


class RayBackend:
    """Places a run's processes on a Ray cluster (the ``ray`` launcher)."""

    def __init__(self, options: RayLauncherOptions, world: int, run_dir: Path) -> None:
        self.options = options
        self.world = world
        self.run_dir = run_dir
        self._ranks_group: Any = None
        self._placed = 0
        self._started_cluster = False

    @classmethod
    def create(cls, *, options: RayLauncherOptions | None = None, world: int = 1, run_dir: Path | None = None
               ) -> RayBackend:
        options = options or RayLauncherOptions()
        backend = cls(options, world, Path(run_dir or "."))
        backend.connect()
        return backend

    def connect(self) -> None:
        address = None if self.options.address == "local" else self.options.address
        if ray.is_initialized():
            return
        # A one-node cluster of our own needs no dashboard; connecting to one, Ray refuses start-up options.
        own = {"include_dashboard": False} if address is None else {}
        try:
            ray.init(address=address, namespace=self.options.namespace, log_to_driver=False, configure_logging=False,
                     **own)
        except ConnectionError as exc:
            raise RunFailed(f"launcher.options.address={self.options.address!r}: no Ray cluster there ({exc}); start "
                            "one with `ray start --head`, or use address = \"local\" for a one-node cluster") from None
        self._started_cluster = address is None

    def describe(self) -> str:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        resources = ray.cluster_resources()
        labels = sorted(name for name in resources if name not in ("CPU", "GPU", "memory", "object_store_memory")
                        and not name.startswith("node:"))
        return (f"launcher: ray at {self.options.address} ({len(nodes)} nodes, {resources.get('CPU', 0):g} CPUs, "
                f"{resources.get('GPU', 0):g} GPUs{', labels ' + ', '.join(labels) if labels else ''})")

    def _forwarded(self) -> dict[str, str]:
        return {key: value for key, value in os.environ.items()
                if any(key.startswith(prefix) for prefix in self.options.forward_env)}

    def _ranks_placement(self) -> Any:
        """The trainer ranks' placement group: one bundle per rank, scheduled all together."""
        if self._ranks_group is None:
            need = self.options.role("trainer")
            bundle = {"CPU": need.num_cpus, **({"GPU": need.num_gpus} if need.num_gpus else {}), **need.resources}
            group = placement_group([dict(bundle) for _ in range(self.world)], strategy=self.options.trainer_strategy)
            try:
                ray.get(group.ready(), timeout=self.options.place_timeout_s)
            except GetTimeoutError:
                remove_placement_group(group)
                raise RunFailed(f"the cluster cannot place {self.world} trainer ranks of {bundle} "
                                f"({self.options.trainer_strategy}) within {self.options.place_timeout_s:g} s") from None
            self._ranks_group = group
        return self._ranks_group

    def place(self, role: str, name: str, *, rank: int | None = None) -> RaySlot:
        need = self.options.role(role)
        self._placed += 1
        settings: dict[str, Any] = {"num_cpus": need.num_cpus, "num_gpus": need.num_gpus,
                                    "name": f"{self.run_dir.name}/{name}/{self._placed}"}
        if role == "trainer" and rank is not None and self.world > 1:
            settings["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self._ranks_placement(), placement_group_bundle_index=rank)
        elif need.resources:
            settings["resources"] = dict(need.resources)
        actor = ProcessHost.options(**settings).remote()  # type: ignore[attr-defined]
        try:
            where = ray.get(actor.where.remote(), timeout=self.options.place_timeout_s)
        except (GetTimeoutError, RayActorError):
            with contextlib.suppress(Exception):
                ray.kill(actor)
            raise RunFailed(f"no Ray node could take {name} ({role}: {need.num_cpus:g} CPU, {need.num_gpus:g} GPU, "
                            f"resources {dict(need.resources)}) within {self.options.place_timeout_s:g} s") from None
        return RaySlot(actor, where, self._forwarded())

    def close(self) -> None:
        if self._ranks_group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._ranks_group)
            self._ranks_group = None
        with contextlib.suppress(Exception):
            ray.shutdown()
