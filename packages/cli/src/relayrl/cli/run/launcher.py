"""Start, supervise and stop the processes of one run.

Order: the trainer first (it builds the model directory, runs the warm-up or recovers a checkpoint,
and publishes the weights the fleet starts from); with ``[weight_sync] stage_url``, the node mirror
that copies each version from the bus to that stage, which the engines read; then the engine
servers, each built with the run's ``[weight_sync]`` section, each of which applies that published
version before it reports ``READY``; then the rollout process over the engines' URLs. With
``[rollout] colocate`` the trainer process hosts the engine and the rollout manager itself
(:mod:`relayrl.cli.run.colocate`): it is the only process, and its liveness includes its fleet's. Every child runs in its own session (a terminal's Ctrl-C reaches only the launcher, which then
stops the children in order) and logs to ``<run_dir>/logs/<name>.log``; on Linux a child also gets
SIGTERM if the launcher itself dies, so a killed launcher leaves no orphans.

Supervision: an engine that dies is restarted on the same port and bootstraps its weights from the
store (the router sees it down, then healthy again); a dead rollout process is restarted (its
producer continues its segment sequence); a trainer that dies abnormally is restarted and resumes
from its newest complete checkpoint; a dead mirror is restarted (engines keep serving meanwhile). Each role has ``[rollout] max_restarts`` restarts within ``restart_window_s``. The run ends
when the trainer exits cleanly (``[trainer] steps`` reached, or stopped). A trainer of ``[trainer]
ranks`` > 1 is one process per rank, supervised as one (:class:`TrainerRanks`).

Where the processes run is the launcher backend's business (``[launcher] backend``; the
:mod:`relayrl.cli.hookspecs` contract): ``local`` (built in) starts them on this machine, a plugin
such as ``relayrl-ray`` places them on a cluster. Everything above is the same for every backend;
an engine that comes back at another address (a cluster placed it on another node) restarts the
rollout process with the new addresses.

One launcher per run: the launcher holds the run's lease (:mod:`relayrl.cli.run.lease`) and hands its
generation to every child. A launcher whose lease a newer one took over stops its fleet, and a child
that finds itself fenced exits with ``EXIT_FENCED``, which is never restarted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from relayrl.cli.hookspecs import LauncherBackend, RoleProcess
from relayrl.cli.run.events import write_event
from relayrl.cli.run.layout import RunLayout
from relayrl.cli.run.lease import EXIT_FENCED, FENCE_ENV, RunLease
from relayrl.cli.run.supervision import (
    DISK_FULL,
    DISK_FULL_WAIT_S,
    LIVENESS_CHECK_S,
    MIN_FREE_BYTES,
    death_cause,
    engine_answers,
    free_bytes,
    mtime,
    newest_checkpoint_bytes,
    recent_restarts,
)
from relayrl.core.config import Config
from relayrl.core.errors import RelayrlError

__all__ = ["Child", "Launcher", "RunFailed", "TrainerRanks"]


class RunFailed(RelayrlError):
    """A process of the run could not start, or kept dying."""


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: children then outlive a killed launcher
        pass


class Child:
    """One supervised process on this machine with its log file (the local launcher's
    :class:`~relayrl.cli.hookspecs.RoleProcess`). ``env`` is added to this process's environment."""

    node = "local"

    def __init__(self, name: str, argv: list[str], log_path: Path, *, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None or self.process.poll() is not None else self.process.pid

    def start(self, *, capture_stdout: bool = False) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE if capture_stdout else self._log,
                                        stderr=self._log, stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                        start_new_session=True, preexec_fn=die_with_parent)

    def read_ready(self, timeout_s: float, on_wait: Callable[[], None] = lambda: None) -> int:
        """Wait for the child's ``READY <port>`` line; copy every other line of its stdout to the log.

        Lines before READY are expected too: libraries in the child (vLLM) log to stdout.
        """
        assert self.process is not None and self.process.stdout is not None
        stdout, log = self.process.stdout, self._log
        ports: list[int] = []
        ready = threading.Event()

        def pump() -> None:
            for line in iter(stdout.readline, b""):
                if not ready.is_set() and line.startswith(b"READY "):
                    ports.append(int(line.split()[1]))
                    ready.set()
                    continue
                log.write(line)
                log.flush()

        threading.Thread(target=pump, name=f"{self.name}-stdout", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(f"{self.name} did not start (see {self.log_path}): "
                                f"{'exited with ' + str(self.process.returncode) if self.process.poll() is not None else 'timed out'}")
            on_wait()
        return ports[0]

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def wait(self, timeout_s: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self._log is not None:
            self._log.close()


class TrainerRanks:
    """The trainer's ``[trainer] ranks`` processes, supervised as one (the ``Child`` interface).

    Ranks run collectives together, so they live and die together: when one exits abnormally the
    others are killed and the whole group is restarted (it resumes from the newest checkpoint
    every rank committed). To stop, only the leader (rank 0) is asked: it finishes its step and
    checkpoint, then tells the other ranks to stop. Each rank logs to ``trainer.log`` (rank 0) or
    ``trainer-<rank>.log``.

    ``elastic`` (``[trainer] elastic``): only the leader's exit ends the group. Another rank that
    exits is restarted alone (up to ``max_restarts`` times; after that the others train on without
    it), and ``on_rank_restart(name, status, restarts, log_tail, restarted)`` says so; the leader
    shrinks the group meanwhile and admits the new process at a step boundary.
    """

    name = "trainer"

    def __init__(self, argv: list[str], logs: Path, world: int, env: dict[str, str], *, backend: LauncherBackend,
                 elastic: bool = False, max_restarts: int = 0, restart_window_s: float = 0.0,
                 on_rank_restart: Callable[[str, int, int, list[str], bool], None] = lambda *_: None) -> None:
        self.argv, self.logs, self.world, self.env, self.backend = argv, logs, world, env, backend
        self.elastic, self.max_restarts, self.on_rank_restart = elastic, max_restarts, on_rank_restart
        self.restart_window_s = restart_window_s
        self._given_up: set[str] = set()
        self.ranks: list[RoleProcess] = []
        self.restarts = 0
        self.failed: str | None = None
        """The rank process whose exit ended the group (``trainer-1``), for the restart event."""
        self._failure: int | None = None

    @property
    def log_path(self) -> Path:
        return self.logs / "trainer.log"

    @property
    def pid(self) -> int | None:
        """The leader's process id (None before :meth:`start`)."""
        return self.ranks[0].pid if self.ranks else None

    @staticmethod
    def rank_name(rank: int) -> str:
        return "trainer" if rank == 0 else f"trainer-{rank}"

    def start(self) -> None:
        # Every rank's place first (a cluster gang-schedules them), then rank 0's address is the rendezvous.
        slots = [self.backend.place("trainer", self.rank_name(rank), rank=rank) for rank in range(self.world)]
        master = slots[0]
        rendezvous = {"MASTER_ADDR": master.host, "MASTER_PORT": str(master.free_port())}
        # LOCAL_RANK: a rank's index among the ranks of its node (which GPU it takes).
        hosts = [slot.host for slot in slots]
        for rank, slot in enumerate(slots):
            local = [index for index, host in enumerate(hosts) if host == hosts[rank]]
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(local.index(rank)), WORLD_SIZE=str(self.world),
                       LOCAL_WORLD_SIZE=str(len(local)), **rendezvous)
            name = self.rank_name(rank)
            self.ranks.append(slot.start(name, self.argv, self.logs / f"{name}.log", env))

    def pids(self) -> dict[str, int]:
        return {child.name: child.pid for child in self.ranks if child.pid is not None and child.poll() is None}

    def poll(self) -> int | None:
        """None while the group runs; 0 once every rank exited cleanly; else the first failure's status."""
        if self._failure is not None:  # the ranks killed below must not be reported as the failure
            return self._failure
        if self.elastic:
            return self._poll_elastic()
        statuses = [child.poll() for child in self.ranks]
        failed = [(child.name, status) for child, status in zip(self.ranks, statuses) if status not in (None, 0)]
        if failed:
            for child in self.ranks:
                child.wait(0)  # kills the ranks still running: they would block in a collective
            self.failed, self._failure = failed[0]
            return self._failure
        if all(status == 0 for status in statuses):
            return 0
        return None

    def _poll_elastic(self) -> int | None:
        """The leader's status; any other rank that has exited is restarted on its own."""
        leader = self.ranks[0].poll()
        if leader is not None:
            for child in self.ranks[1:]:
                child.wait(0 if leader != 0 else 10)  # after a clean stop they are leaving already
            if leader != 0:
                self.failed, self._failure = "trainer", leader
            return leader
        for index, child in enumerate(self.ranks[1:], start=1):
            status = child.poll()
            if status is None or child.name in self._given_up:
                continue
            tail = log_tail(child.log_path)
            child.wait(0)
            now = time.monotonic()
            recent = recent_restarts(child, self.restart_window_s, now)
            if len(recent) >= self.max_restarts:
                self._given_up.add(child.name)
                self.on_rank_restart(child.name, status, child.restarts, tail, False)
                continue
            fresh = self.backend.place("trainer", child.name, rank=index).start(child.name, self.argv, child.log_path,
                                                                                  child.env)
            fresh.restarts = child.restarts + 1
            fresh.restart_times = [*recent, now]
            self.ranks[index] = fresh
            self.on_rank_restart(child.name, status, fresh.restarts, tail, True)
        return None

    def terminate(self) -> None:
        if self.ranks:
            self.ranks[0].terminate()

    def wait(self, timeout_s: float) -> None:
        if not self.ranks:
            return
        self.ranks[0].wait(timeout_s)
        for child in self.ranks[1:]:
            child.wait(min(timeout_s, 30))  # they stop once the leader has told them to (or died)


def log_tail(path: Path, lines: int = 6) -> list[str]:
    """The last ``lines`` non-empty lines of a log (progress bars' carriage returns resolved)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 16384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    kept = [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return [line[:300] for line in kept if line.strip()][-lines:]


def _command_line(pid: int) -> str:
    """The command line of a live process ('' when it is gone, a zombie, or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Launcher:
    """Runs one ``relayrl run`` (see the module docstring)."""

    def __init__(self, layout: RunLayout, config: Config, *, on_tick: Callable[[], None] = lambda: None,
                 backend: LauncherBackend | None = None, lease: RunLease | None = None) -> None:
        self.layout = layout
        self.lease = lease
        """The run's lease, taken by the caller; the launcher keeps it beating while it runs."""
        self.lost_lease: str | None = None
        self.config = config
        self.on_tick = on_tick
        self._display_failed = False
        self._liveness_checked = 0.0  # when _check_liveness last looked
        if backend is None:
            from relayrl.cli.run.local_backend import LocalBackend

            backend = LocalBackend()
        self.backend = backend
        """Where the processes run (``[launcher] backend``)."""
        self.stopping = threading.Event()
        self.trainer: RoleProcess | TrainerRanks | None = None
        self.engines: list[RoleProcess] = []
        self.mirror: RoleProcess | None = None
        """The node mirror (``[weight_sync] stage_url``): copies each version from the bus to the stage."""
        self.engine_urls: list[str] = []
        self.rollout: RoleProcess | None = None
        self._status_view: dict[str, Any] = {}

    # ------------------------------------------------------------------ processes
    def _env(self) -> dict[str, str]:
        """What every process gets on top of the environment of the place it runs in."""
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        if self.lease is not None and self.lease.generation is not None:
            env[FENCE_ENV] = str(self.lease.generation)
        return env

    def _start(self, role: str, name: str, argv: list[str], *, capture_stdout: bool = False) -> RoleProcess:
        """Place and start one process (``argv`` without the interpreter), logging to ``logs/<name>.log``."""
        slot = self.backend.place(role, name)
        return slot.start(name, argv, self.layout.logs / f"{name}.log", self._env(), capture_stdout=capture_stdout)

    def _trainer_child(self) -> RoleProcess | TrainerRanks:
        argv = ["-m", "relayrl.cli.run.trainer_process", str(self.layout.root)]
        if self.config.trainer.ranks > 1:
            ranks = TrainerRanks(argv, self.layout.logs, self.config.trainer.ranks, env=self._env(),
                                 backend=self.backend, elastic=self.config.trainer.elastic,
                                 max_restarts=self.config.rollout.max_restarts,
                                 restart_window_s=self.config.rollout.restart_window_s, on_rank_restart=self._rank_restarted)
            ranks.start()
            return ranks
        return self._start("trainer", "trainer", argv)

    def _engine_argv(self, index: int, host: str, port: int = 0) -> list[str]:
        section = self.config.rollout
        return ["-m", "relayrl.rollout.engines.http", "--model", str(self.layout.model_path(self.config)),
                "--host", host, "--port", str(port), "--engine-id", f"engine-{index}",
                "--threads", str(section.engine_threads),
                "--max-batch", str(section.max_batch), "--seed", str(self.config.run.seed + index),
                "--bus", self.layout.bus_url(self.config), "--bus-options", json.dumps(dict(self.config.store.options)),
                # The run's [weight_sync]: apply mode, verification, cache resets, the node mirror ...
                "--weight-sync", msgspec.json.encode(self.config.weight_sync).decode(),
                "--wait-for-weights", str(section.start_timeout_s),
                "--engine", section.engine, "--engine-options", json.dumps(dict(section.engine_options)),
                # What the trainer publishes (low-precision rollouts: engine_dtype): weight sync is bit-exact.
                "--dtype", section.serving_dtype(self.config.model),
                # Routers whose engines register themselves (Dynamo) get each engine registered.
                "--router", section.router, "--router-options", json.dumps(dict(section.router_options)),
                "--deployment", str(self.layout.root)]

    def _mirror_child(self) -> RoleProcess:
        """The node mirror: versions cross from the bus to ``stage_url`` once for every engine."""
        section = self.config.weight_sync
        return self._start("mirror", "mirror", ["-m", "relayrl.weight_sync.mirror", self.layout.bus_url(self.config),
                                                section.stage_url, "--remote-options",
                                                json.dumps(dict(self.config.store.options)), "--prefix", section.prefix,
                                                "--poll-interval", str(section.poll_interval_s)])

    def _rollout_child(self) -> RoleProcess:
        return self._start("rollout", "rollout", ["-m", "relayrl.cli.run.rollout_process", str(self.layout.root),
                                                  *self.engine_urls])

    def _start_engine(self, index: int, port: int = 0) -> tuple[RoleProcess, str]:
        """Engine ``index`` started and serving; its URL. ``port``: the one it had (0: any), kept
        when it comes back on the same host, so the router finds it again."""
        name = f"engine-{index}"
        slot = self.backend.place("engine", name)
        previous = self.engine_urls[index] if index < len(self.engine_urls) else ""
        if not previous.startswith(f"http://{slot.host}:"):
            port = 0
        child = slot.start(name, self._engine_argv(index, slot.host, port), self.layout.logs / f"{name}.log",
                           self._env(), capture_stdout=True)
        bound = child.read_ready(self.config.rollout.start_timeout_s, self._tick)
        return child, f"http://{slot.host}:{bound}"

    def _tick(self) -> None:
        if self.stopping.is_set():
            raise KeyboardInterrupt
        self._write_pids()
        try:
            self.on_tick()
        except Exception as exc:  # the display must never take the supervisor down with it
            if not self._display_failed:
                self._display_failed = True
                print(f"relayrl run: the progress display failed ({type(exc).__name__}: {exc}); "
                      "the run goes on", file=sys.stderr, flush=True)

    def _write_pids(self) -> None:
        """``status/launcher.json``: the pid of every live child and the node it runs on (for operators,
        and the fault tests)."""
        children: list[Any] = [*self.engines, self.rollout, self.mirror]
        if isinstance(self.trainer, TrainerRanks):
            children += self.trainer.ranks
        elif self.trainer is not None:
            children.append(self.trainer)
        live = [child for child in children if child is not None and child.pid is not None and child.poll() is None]
        view = {"pid": os.getpid(), "children": {child.name: child.pid for child in live},
                "nodes": {child.name: child.node for child in live}}
        if view != self._status_view and self.layout.write_status("launcher", view):
            self._status_view = view  # a write that failed (a full disk) is tried again at the next tick

    def _wait_for_first_weights(self) -> None:
        assert self.trainer is not None
        bus = self.layout.bus(self.config)
        deadline = time.monotonic() + max(self.config.rollout.start_timeout_s, 3600.0)  # includes the warm-up
        key = f"{self.config.weight_sync.prefix.strip('/')}/latest"
        while not bus.exists(key):
            if self.trainer.poll() is not None:
                last = (log_tail(self.trainer.log_path, 1) or ["no output"])[-1]
                raise RunFailed(f"the trainer exited with {self.trainer.poll()} before publishing weights: "
                                f"{last.strip()[-240:]} (see {self.trainer.log_path}); fix the config and run it "
                                f"again: a run that never started is started over")
            if time.monotonic() > deadline:
                raise RunFailed("the trainer published no weights in time")
            self._tick()
            time.sleep(0.2)

    def _wait_for_previous_children(self, grace_s: float = 120.0) -> None:
        """Let the children of a killed launcher of this run finish before ours start.

        They got SIGTERM when it died and may still be writing a step's checkpoint; a trainer
        started now would recover from the step before. After ``grace_s`` they are killed. Only
        processes whose command line names this run directory are waited for (pids get reused).
        """
        previous = self.layout.read_status("launcher")
        if previous.get("pid") == os.getpid():
            return
        pids = [pid for pid in previous.get("children", {}).values()
                if isinstance(pid, int) and str(self.layout.root) in _command_line(pid)]
        if not pids:
            return
        print(f"waiting for {len(pids)} process(es) of the previous launcher of this run to exit", flush=True)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = [pid for pid in pids if str(self.layout.root) in _command_line(pid)]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if pids:
            write_event(self.layout, "launcher", "orphans", f"killed {len(pids)} process(es) of the previous launcher "
                        f"still running after {grace_s:.0f} s", level="warning", data={"pids": pids})

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Start everything, supervise until the trainer finishes; return the trainer's exit status."""
        write_event(self.layout, "launcher", "started", f"run started in {self.layout.root}")
        self._wait_for_previous_children()
        for name in ("rollout", "launcher"):  # a previous launch's views would be read as current
            (self.layout.status / f"{name}.json").unlink(missing_ok=True)
        if self.lease is not None:
            self.lease.on_lost = self._lease_lost
            self.lease.start_heartbeat()
        try:
            self.trainer = self._trainer_child()
            self._wait_for_first_weights()
            if self.config.weight_sync.stage_url:  # the engines read the stage: fill it first
                self.mirror = self._mirror_child()
            # With engines_in_process the rollout process hosts the engines itself: no engine servers;
            # with colocate the trainer hosts the engine and the rollout manager: no other process.
            section = self.config.rollout
            for index in range(0 if section.engines_in_process or section.colocate else section.engines):
                child, url = self._start_engine(index)
                self.engines.append(child)
                self.engine_urls.append(url)
            if not section.colocate:
                self.rollout = self._rollout_child()
            return self._supervise()
        except KeyboardInterrupt:
            if self.lost_lease is not None:
                write_event(self.layout, "launcher", "lease-lost", self.lost_lease, level="error")
                raise RunFailed(self.lost_lease) from None
            write_event(self.layout, "launcher", "stopped", "stopped by the user")
            return 130
        finally:
            self.shutdown()

    def _supervise(self) -> int:
        assert self.trainer is not None
        limit = self.config.rollout.max_restarts
        while True:
            self._tick()
            self._check_run_directory()
            self._check_liveness()
            status = self.trainer.poll()
            if status == 0:
                write_event(self.layout, "launcher", "finished", "the trainer finished")
                return 0
            for child in (self.trainer, *([self.rollout] if self.rollout is not None else [])):
                if child.poll() == EXIT_FENCED:  # restarting it would only be fenced again
                    raise RunFailed(f"{child.name} stopped: another writer holds this run's bus (a newer launcher, "
                                    f"or a trainer started by hand; see {child.log_path})")
            if status is not None:
                self.trainer = self._restart(self.trainer, limit, self._trainer_child)
            if self.mirror is not None and self.mirror.poll() is not None:
                self.mirror = self._restart(self.mirror, limit, self._mirror_child)
            moved = False
            for index, engine in enumerate(self.engines):
                if engine.poll() is not None:
                    before = self.engine_urls[index]
                    self.engines[index] = self._restart(engine, limit, lambda i=index: self._revive_engine(i))
                    moved = moved or self.engine_urls[index] != before
            if self.rollout is None:  # colocated: the trainer process is the whole fleet
                time.sleep(0.5)
                continue
            if moved and self.rollout.poll() is None:
                # The rollout process knows the engines by address: start it again with the new ones (its
                # producer continues its segment sequence, as after any restart of it).
                write_event(self.layout, "launcher", "engine-moved", "an engine came back at another address; "
                            "restarting the rollout process with the new addresses",
                            data={"engines": list(self.engine_urls)})
                self.rollout.terminate()
                self.rollout.wait(30)
                rollout = self._rollout_child()
                rollout.restarts = self.rollout.restarts
                self.rollout = rollout
            if self.rollout.poll() is not None:
                self.rollout = self._restart(self.rollout, limit, self._rollout_child)
            time.sleep(0.5)

    def _rank_restarted(self, name: str, status: int, restarts: int, tail: list[str], restarted: bool) -> None:
        """An elastic trainer rank exited: the leader trains on without it; say whether it comes back."""
        data = {"process": name, "exit": status, "restarts": restarts, "log_tail": tail, "elastic": True,
                "log": str(self.layout.logs / f"{name}.log")}
        if restarted:
            write_event(self.layout, "launcher", "restart", f"{name} died (exit {status}); restarting it alone "
                        "(elastic: the other ranks train on and admit it at a step boundary)", level="warning",
                        data=data)
        else:
            write_event(self.layout, "launcher", "restart", f"{name} died (exit {status}) after {restarts} restarts; "
                        "not restarting it: the other ranks train on without it", level="error", data=data)

    def _revive_engine(self, index: int) -> RoleProcess:
        port = int(self.engine_urls[index].rsplit(":", 1)[1])
        child, self.engine_urls[index] = self._start_engine(index, port)
        return child

    def _check_run_directory(self) -> None:
        """A run directory deleted under a running run cannot be resumed or reported: stop, and say so."""
        if not self.layout.config_path.exists():
            raise RunFailed(f"the run directory {self.layout.root} was deleted (or its config.json) while the run was "
                            f"going; stopping it: nothing of it can be resumed")

    def _check_liveness(self) -> None:
        """Kill a process that showed no sign of life for ``[rollout] liveness_timeout_s`` (stopped,
        deadlocked): the restart path then restarts it, with the cause in its event.

        Signs: ``status/trainer.alive`` (the trainer's loop; a thread of it while it starts),
        ``status/rollout.alive`` (the rollout process's event loop, every second), an engine's
        ``GET /health``. Touching a file needs no disk space, so a full disk is not taken for a hang.
        A process is watched from its first sign after the launcher first saw it."""
        timeout = self.config.rollout.liveness_timeout_s
        now = time.time()
        if timeout <= 0 or now - self._liveness_checked < min(LIVENESS_CHECK_S, timeout / 4):
            return
        self._liveness_checked = now
        watched: list[tuple[Any, Callable[[], float | None]]] = [
            (self.trainer, self._trainer_sign), (self.rollout, lambda: mtime(self.layout.status / "rollout.alive"))]
        watched += [(engine, lambda url=url: time.time() if engine_answers(url) else None)
                    for engine, url in zip(self.engines, self.engine_urls)]
        for child, sign in watched:
            if child is None or child.poll() is not None:
                continue
            first_seen = child.__dict__.setdefault("liveness_first_seen", now)
            last = sign()
            if last is not None and last >= first_seen:
                child.__dict__["liveness_last_sign"] = max(last, child.__dict__.get("liveness_last_sign", last))
            last_sign = child.__dict__.get("liveness_last_sign")
            if last_sign is None or time.time() - last_sign <= timeout:
                continue
            child.hung = (f"no sign of life for {time.time() - last_sign:.0f} s ([rollout] liveness_timeout_s = "
                          f"{timeout:g}): stopped or deadlocked")
            write_event(self.layout, "launcher", "hung", f"{child.name}: {child.hung}; killing it to restart it",
                        level="warning", data={"process": child.name})
            members = child.ranks if isinstance(child, TrainerRanks) else [child]
            for member in members:
                member.terminate()
            for member in members:
                member.wait(5)  # SIGKILL after 5 s: a stopped process does not act on SIGTERM

    def _trainer_sign(self) -> float | None:
        """The trainer's last sign of life; colocated, the older of its loop's and its fleet thread's
        (a hung fleet leaves the trainer waiting for batches forever), once the fleet has given one in
        this trainer's life (it starts after the warm-up)."""
        trainer = mtime(self.layout.status / "trainer.alive")
        if not self.config.rollout.colocate or trainer is None:
            return trainer
        fleet = mtime(self.layout.status / "rollout.alive")
        started = getattr(self.trainer, "liveness_first_seen", None)
        if fleet is None or started is None or fleet < started:
            return trainer
        return min(trainer, fleet)

    def _full_disk_cause(self, status: int | None) -> str | None:
        """A process that exited on its own while the run directory's disk has no room died of it, even
        when its log does not say so: the disk may have cut the log short before the error's last line
        (found by the transient-fault soak: such a trainer was restarted at once, again and again)."""
        if status is None or status <= 0:
            return None
        free = free_bytes(self.layout.root)
        if free >= MIN_FREE_BYTES + newest_checkpoint_bytes(self.layout.root):
            return None
        return f"{DISK_FULL} ({free >> 20} MiB free in {self.layout.root}; its log may be cut short by it)"

    def _wait_for_disk_space(self, name: str, cause: str) -> None:
        """Before restarting a process that died of a full disk: wait (supervising) until the run
        directory's file system has room again, so that a disk that fills and frees costs one restart,
        not a restart storm; a disk that stays full for ``DISK_FULL_WAIT_S`` ends the run, saying so."""
        needed = MIN_FREE_BYTES + newest_checkpoint_bytes(self.layout.root)
        if free_bytes(self.layout.root) >= needed:
            return
        write_event(self.layout, "launcher", "disk-full", f"{name} died: {cause}; waiting for {needed >> 20} MiB free "
                    f"in {self.layout.root} before restarting it", level="warning", data={"process": name})
        deadline = time.monotonic() + DISK_FULL_WAIT_S
        while free_bytes(self.layout.root) < needed:
            if time.monotonic() > deadline:
                raise RunFailed(f"{name} died: {cause}; the disk stayed full for {DISK_FULL_WAIT_S:.0f} s "
                                f"(free space in {self.layout.root}, then continue with --resume)")
            self._tick()
            time.sleep(1.0)

    def _restart(self, child: Any, limit: int, make: Callable[[], Any]) -> Any:
        status = child.poll()
        tail = log_tail(child.log_path)
        window = self.config.rollout.restart_window_s
        now = time.monotonic()
        recent = recent_restarts(child, window, now)
        if len(recent) >= limit:
            print(f"last lines of {child.log_path}:\n" + "\n".join(f"  {line}" for line in tail), file=sys.stderr,
                  flush=True)
            within = f" within {window:.0f} s" if window > 0 else ""
            cause = getattr(child, "hung", None) or death_cause(status, tail) or self._full_disk_cause(status)
            raise RunFailed(f"{child.name} died (exit {status}{': ' + cause if cause else ''}) after {len(recent)} "
                            f"restarts{within} ([rollout] max_restarts, restart_window_s; {child.restarts} in the "
                            f"whole run); see {child.log_path}")
        what = child.name
        if isinstance(child, TrainerRanks) and child.failed is not None:
            what = f"{child.name} (process {child.failed}; every rank restarts)"
        cause = getattr(child, "hung", None) or death_cause(status, tail) or self._full_disk_cause(status)
        if cause and cause.startswith(DISK_FULL):
            self._wait_for_disk_space(child.name, cause)
        # The log's last lines travel with the event: the display prints them, the report lists them.
        write_event(self.layout, "launcher", "restart",
                    f"{what} died (exit {status}{': ' + cause if cause else ''}); restarting",
                    level="warning", data={"process": child.name, "exit": status, "restarts": child.restarts + 1,
                                           "log_tail": tail, "log": str(child.log_path)})
        child.wait(0)
        fresh = make()
        fresh.restarts = child.restarts + 1
        fresh.restart_times = [*recent, now]
        return fresh

    def shutdown(self) -> None:
        """Stop the fleet first (nothing new is generated), then the trainer (it checkpoints and exits)."""
        children: list[Any] = [self.rollout, *self.engines, self.mirror]
        for child in children:
            if child is not None:
                child.terminate()
        for child in children:
            if child is not None:
                child.wait(30)
        if self.trainer is not None:
            self.trainer.terminate()
            self.trainer.wait(120)
        self.backend.close()

    def stop(self) -> None:
        """Ask the run to stop (from a signal handler)."""
        self.stopping.set()

    def _lease_lost(self, reason: str) -> None:
        """From the lease's heartbeat thread: a newer launcher runs this run now; stop ours."""
        self.lost_lease = reason
        print(f"relayrl run: {reason}", file=sys.stderr, flush=True)
        self.stopping.set()
