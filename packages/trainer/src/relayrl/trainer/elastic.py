"""Elastic trainer ranks (``[trainer] elastic = true``): the group shrinks when a rank dies and regrows
when the launcher has restarted it, while rank 0 trains on.

Rank 0, the leader (process ``trainer``), owns the run as it does without elasticity (bus, weights,
ledger, checkpoints). It never waits for the other ranks to exist: it starts alone, and at every step
boundary it admits the ranks that have announced themselves ready. A rank that dies costs the step
it died in, which the survivors redo on the same batch; the run goes on with fewer ranks until the
launcher's restart of it is admitted again. Only the leader's death restarts every rank (from the
newest checkpoint, as without elasticity).

Everything goes through files in ``<run>/elastic/`` (the ranks of one ``relayrl run`` share a machine):

* ``members/<name>.json``: a rank other than 0 announces itself ready to join, with its process
  identity and a *ticket* it renews whenever it is back to waiting (after a failed collective, or a
  group that did not form). The leader admits a (process, ticket) once; a rank that was admitted and
  did not take part (hung, or died) is not admitted again until it renews.
* ``view.json``: the current group, written by the leader: a generation number, the members in rank
  order (the leader first) with the ticket each was admitted on, and the leader's identity (a rank
  waiting for a leader that is gone exits; the launcher decides what comes next).
* ``gen-<generation>.store``: the torch.distributed FileStore each generation's group meets in.

Each time a group forms, every member takes the leader's trainer state (model, optimiser state,
policy version, step): a joining rank starts from it, and survivors of a failed step drop whatever
the failure left half-done.

Gloo does not always notice a dead peer: a send to a rank that was SIGKILLed at the wrong moment
can wait for gloo's timeout (minutes) instead of failing, and destroying a process group waits for
its pending operations. So each generation is a ``ProcessGroupGloo`` of its own (not torch.
distributed's default group), every operation on it is waited for by polling, and while it waits a
rank checks the others: a member whose process is gone, or who has announced itself again (it left
the group), or (for the other ranks) a newer view without this rank ends the wait with an error at
once. A group given up on is set aside, never destroyed while an operation of it may still be
pending (its threads would hold the process for that long).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from relayrl.core.processes import identity, is_dead
from relayrl.trainer.distributed import GroupCollectives, set_data_parallel_group
from relayrl.trainer.ranks import broadcast_decision

__all__ = ["ElasticRanks", "LeaderGone", "View", "describe_failure"]

FORM_TIMEOUT = datetime.timedelta(seconds=30)
"""How long a new generation's members wait for each other to meet (then the attempt fails)."""
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=180)
"""How long a formed group's collective waits (a hung rank stalls the leader at most this long). The
leader's longest stretch without a collective is one step's bookkeeping (publish, checkpoint)."""
RENEW_TIMEOUT_S = 60.0
"""After a failure, how long the leader waits for each surviving rank to come back to waiting (a
rank busy in its forward pass notices at its next collective)."""
ADMIT_EVERY_S = 1.0
"""How often the leader looks for newcomers at its step boundaries."""
CHECK_EVERY_S = 0.2
"""While an operation is pending, how often a rank checks that the other members are still there."""
MAX_FORM_ATTEMPTS = 3
"""Failed formations in a row after which the leader goes on alone (and admits again at the next boundary)."""


@dataclasses.dataclass(frozen=True)
class View:
    """One generation of the group: its members in rank order (the leader first), with their tickets."""

    generation: int
    members: tuple[tuple[str, int, int], ...]
    """``(name, pid, ticket)`` per rank."""
    leader: dict[str, Any]
    """The leader's process identity (:func:`relayrl.core.processes.identity`)."""

    @property
    def world(self) -> int:
        return len(self.members)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.members]

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "members": [list(m) for m in self.members],
                           "leader": self.leader}).encode()

    @classmethod
    def decode(cls, data: bytes) -> View:
        raw = json.loads(data)
        return cls(int(raw["generation"]), tuple((str(n), int(p), int(t)) for n, p, t in raw["members"]),
                   dict(raw["leader"]))


class LeaderGone(Exception):
    """The leader's process ended while this rank waited to be admitted."""


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def describe_failure(failure: BaseException) -> str:
    """One line for a failed collective.

    Callers keep this line, not the exception, and recover *after* the ``except`` block: the
    exception's traceback holds the failed step's frames (activations, gradients) for as long as it
    lives, and recovery can take a while.
    """
    first = str(failure).splitlines()[0] if str(failure) else ""
    return f"{type(failure).__name__}: {first[:200]}"


def _log(message: str) -> None:
    """One line in this rank's log: the launcher keeps each rank's output (``logs/trainer*.log``)."""
    print(f"[elastic {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class ElasticRanks:
    """This process's place in the elastic group, with the ``Ranks`` interface the trainer process uses.

    ``rank``/``world`` describe the group as it is now (a world of one while the leader is alone or a
    rank waits). The leader calls :meth:`open` once it can admit ranks, :meth:`newcomers` and :meth:`grow` at
    step boundaries and :meth:`recover` after a failed collective; a rank other than 0 calls :meth:`join`
    (and again after every failure) and :meth:`follow_view` when the leader regroups.
    """

    elastic = True

    def __init__(self, root: str | os.PathLike[str], name: str, *, leader: bool,
                 on_change: Callable[[str, str, dict[str, Any]], None] = lambda kind, message, data: None) -> None:
        self.directory = Path(root) / "elastic"
        self.members_dir = self.directory / "members"
        self.name = name
        self.leader = leader
        self.on_change = on_change
        """``(kind, message, data)`` on the leader each time the group shrinks or grows (for run events)."""
        self.view: View | None = None
        self.rank = 0
        self.world = 1
        self.regroups = 0
        self.get_state: Callable[[], dict[str, Any]] = dict
        """On the leader: the trainer state every member takes when a group forms."""
        self.set_state: Callable[[dict[str, Any]], None] = lambda state: None
        """On other ranks: takes the leader's state."""
        self._ticket = 0
        self._admitted: set[tuple[str, int, int]] = set()
        self._checked = 0.0
        self.group: GroupCollectives | None = None
        self._generation = 0  # of the group this rank is in
        self._pending: Any = None  # the operation being waited for
        self._set_aside: list[tuple[Any, Any]] = []  # groups given up on, with their last operation

    # ------------------------------------------------------------------ the Ranks interface
    def init(self) -> None:
        """Nothing to join yet: the leader starts alone and other ranks wait to be admitted."""

    def broadcast(self, value: Any) -> Any:
        if self.world == 1 or self.group is None:
            return value
        return self.group.broadcast_object(value, 0)

    def broadcast_decision(self, decision: Any) -> Any:
        return decision if self.world == 1 else broadcast_decision(self, decision)

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Nothing to do: a rank takes the whole trainer state when it is admitted."""

    def agree_on_min(self, value: int) -> int:
        return value  # the leader alone recovers a checkpoint; the others take its state

    def barrier(self) -> None:
        """Nothing to do: ranks meet only in a formed group, after the leader has built the run."""

    def close(self) -> None:
        self._destroy()

    @property
    def stuck(self) -> bool:
        """Whether a group given up on still has an operation pending: the process should end with
        ``os._exit`` (interpreter shutdown would wait for gloo's timeout)."""
        return any(work is not None and not work.is_completed() for _, work in self._set_aside)

    # ------------------------------------------------------------------ the leader
    def open(self) -> None:
        """Leader: the run is built (model directory written): ranks may build theirs and announce."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.members_dir.mkdir(exist_ok=True)
        previous = _read_json(self.directory / "view.json")
        generation = int(previous["generation"]) if previous else 0
        for stale in self.directory.glob("gen-*.store*"):  # an earlier leader's groups
            with contextlib.suppress(OSError):
                stale.unlink()
        self._set_view(View(generation + 1, ((self.name, os.getpid(), 0),), identity()))

    def newcomers(self) -> View | None:
        """Leader, at a step boundary: the larger group to form when ranks are ready to join, else None.

        Every current member must learn of it before it forms (the caller broadcasts it as a regroup
        decision, then calls :meth:`grow`), so that all switch groups at the same point.
        """
        now = time.monotonic()
        if now - self._checked < ADMIT_EVERY_S:
            return None
        self._checked = now
        ready = [member for member in self._ready() if member not in self._admitted]
        if not ready:
            return None
        # A rank restarted before its predecessor's death was noticed replaces it (the broadcast of
        # this view to the dead one fails first, and recovery takes over).
        names = {name for name, _, _ in ready}
        staying = [member for member in self.view.members[1:] if member[0] not in names]
        return View(self.view.generation + 1, (self.view.members[0], *staying, *ready), identity())

    def grow(self, view: View) -> None:
        """Leader: form ``view`` (from :meth:`newcomers`, its members told); when it does not form, recover."""
        before = self.view
        if not self._try_form(view):
            self.recover("the enlarged group did not form", lost=before)
            return
        joined = [name for name in view.names if name not in before.names]
        self.on_change("grew", f"{', '.join(joined)} joined: {view.world} ranks train", {
            "joined": joined, "world_size": view.world, "previous_world_size": before.world,
            "generation": view.generation})

    def recover(self, failure: str, *, lost: View | None = None) -> None:
        """Leader, after a failed collective (``failure``: :func:`describe_failure`; call this outside
        the ``except`` block): re-form with the ranks that are alive and back to waiting.

        Never fails: when no group forms (after :data:`MAX_FORM_ATTEMPTS`), the leader goes on alone.
        ``lost``: the group that failed (default: the current one).
        """
        started = time.monotonic()
        lost_view = lost or self.view
        _log(f"collective failed in generation {lost_view.generation} ({failure}); re-forming")
        self._destroy()
        self._set_view(View(self.view.generation + 1, (lost_view.members[0],), identity()))
        for _ in range(MAX_FORM_ATTEMPTS):
            survivors = self._await_survivors(lost_view)
            if self._try_form(View(self.view.generation + 1, (lost_view.members[0], *survivors), identity())):
                break
        lost = [name for name in lost_view.names if name not in self.view.names]
        downtime = time.monotonic() - started
        data = {"lost": lost, "world_size": self.view.world, "previous_world_size": lost_view.world,
                "generation": self.view.generation, "downtime_s": downtime,
                "failure": failure}
        if lost:
            self.on_change("shrank", f"{', '.join(lost)} left the group: {self.view.world} rank(s) go on "
                           f"(re-formed in {downtime:.1f} s)", data)
        else:
            self.on_change("re-formed", f"the group re-formed with {self.view.world} rank(s) in {downtime:.1f} s "
                           f"after: {data['failure'][:120]}", data)

    def _await_survivors(self, lost: View) -> list[tuple[str, int, int]]:
        """The lost group's ranks that renewed their ticket (alive, waiting), once each has renewed or died."""
        deadline = time.monotonic() + RENEW_TIMEOUT_S
        former = {name: pid for name, pid, _ in lost.members[1:]}
        while True:
            ready = {member[0]: member for member in self._ready()
                     if member[0] in former and member[1] == former[member[0]] and member not in self._admitted}
            undecided = [name for name in former if name not in ready and self._alive(name, former[name])]
            if not undecided or time.monotonic() > deadline:
                if undecided:
                    _log(f"{', '.join(undecided)} did not come back within {RENEW_TIMEOUT_S:.0f} s: left out")
                return [ready[name] for name in former if name in ready]
            time.sleep(0.05)

    def _ready(self) -> list[tuple[str, int, int]]:
        """Announced ranks whose process is alive, as ``(name, pid, ticket)``, by name."""
        ready = []
        for path in sorted(self.members_dir.glob("*.json")):
            record = _read_json(path)
            if not record or is_dead(record.get("identity", {})) is True:
                continue
            ready.append((path.stem, int(record["identity"]["pid"]), int(record["ticket"])))
        return ready

    def _alive(self, name: str, pid: int) -> bool:
        record = _read_json(self.members_dir / f"{name}.json")
        if not record or record.get("identity", {}).get("pid") != pid:
            return False  # another incarnation announced itself: that one is gone
        return is_dead(record["identity"]) is not True

    def _try_form(self, view: View) -> bool:
        """Leader: form ``view``'s group and hand every member the trainer state; whether it worked."""
        self._admitted.update(view.members[1:])
        self._destroy()
        self._set_view(view)
        if view.world == 1:
            return True
        failure = None
        try:
            self._connect(view)
            self.broadcast(_serialise(self.get_state()))
        except Exception as error:  # a member died or hung meanwhile: the caller tries again without it
            failure = describe_failure(error)
        if failure is not None:  # (out of the except block: see describe_failure)
            _log(f"generation {view.generation} did not form: {failure}")
            self._destroy()
            self._set_view(View(view.generation + 1, (view.members[0],), identity()))
            return False
        self.regroups += 1
        _log(f"generation {view.generation}: {', '.join(view.names)}")
        return True

    def _set_view(self, view: View) -> None:
        self.view = view
        self.rank, self.world = 0, view.world
        _write_atomically(self.directory / "view.json", view.encode())
        for old in self.directory.glob("gen-*.store"):  # groups two generations back are gone everywhere
            with contextlib.suppress(ValueError, OSError):
                if int(old.stem.split("-")[1]) < view.generation - 1:
                    old.unlink()

    # ------------------------------------------------------------------ the other ranks
    def wait_for_leader(self) -> None:
        """Wait until a live leader has opened the group (its run built). A view of an earlier leader
        does not count: that one is gone, and the launcher restarts this rank with the next one."""
        while True:
            view = self._current_view()
            if view is not None and is_dead(view.leader) is not True:
                return
            time.sleep(0.2)

    def announce(self) -> None:
        """Tell the leader this rank is (again) ready to join, with a fresh ticket."""
        self.members_dir.mkdir(parents=True, exist_ok=True)
        self._ticket += 1
        _write_atomically(self.members_dir / f"{self.name}.json",
                          json.dumps({"identity": identity(), "ticket": self._ticket}).encode())

    def join(self) -> None:
        """Announce, wait until a view admits this (process, ticket), form it, take the leader's state.

        Raises :class:`LeaderGone` when the leader's process ends meanwhile. A group that does not form
        sends this rank back to waiting with a new ticket.
        """
        self._destroy()
        self.rank, self.world = 0, 1
        while True:
            self.announce()
            me = (self.name, os.getpid(), self._ticket)
            while True:
                view = self._current_view()
                if view is not None and is_dead(view.leader) is True:
                    raise LeaderGone("the leader's process has ended")
                if view is not None and me in view.members:
                    break
                time.sleep(0.1)
            if self.follow_view(view):
                return

    def follow_view(self, view: View) -> bool:
        """Form ``view``'s group as one of its members and take the leader's state; whether it worked."""
        self._destroy()
        failure = None
        try:
            self._connect(view)
            self.view = view
            state = self.broadcast(None)
        except Exception as error:
            failure = describe_failure(error)
        if failure is not None:
            _log(f"generation {view.generation} did not form: {failure}")
            self._destroy()
            self.rank, self.world = 0, 1
            return False
        self.set_state(_deserialise(state))
        self.regroups += 1
        _log(f"joined generation {view.generation} as rank {self.rank} of {self.world}")
        return True

    def _current_view(self) -> View | None:
        try:
            return View.decode((self.directory / "view.json").read_bytes())
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # ------------------------------------------------------------------ both
    def _connect(self, view: View) -> None:
        """Meet the other members of ``view`` in a gloo group of its own (see the module docstring)."""
        rank = view.names.index(self.name)
        store = dist.FileStore(str(self.directory / f"gen-{view.generation}.store"), view.world)
        store.set_timeout(FORM_TIMEOUT)
        group = dist.ProcessGroupGloo(store, rank, view.world, FORM_TIMEOUT)
        # Formed: from now on an operation may wait for the leader's bookkeeping between steps.
        group._set_default_timeout(COLLECTIVE_TIMEOUT)
        self.group = GroupCollectives(group, wait=self._wait)
        self._generation = view.generation
        self._members = view
        self.rank, self.world = rank, view.world
        set_data_parallel_group(self.group)

    def _wait(self, work: Any) -> None:
        """Wait for ``work`` by polling; raise at once when the group has lost a member."""
        self._pending = work
        delay, next_check = 0.0002, time.monotonic() + CHECK_EVERY_S
        while not work.is_completed():
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                lost = self._lost_member()
                if lost:
                    raise RuntimeError(f"generation {self._generation}: {lost}")
        work.wait()  # raises the operation's own error, if it failed

    def _lost_member(self) -> str | None:
        """Why the current group cannot complete an operation any more, or None."""
        view = self._members
        for name, pid, ticket in view.members:
            if name == self.name:
                continue
            if name == view.members[0][0]:  # the leader
                if is_dead(view.leader) is True:
                    return f"the leader ({name}, pid {pid}) has died"
                continue
            record = _read_json(self.members_dir / f"{name}.json")
            if not record or record.get("identity", {}).get("pid") != pid or is_dead(record["identity"]) is True:
                return f"{name} (pid {pid}) has died"
            if int(record.get("ticket", 0)) > ticket:
                return f"{name} (pid {pid}) left the group"
        if not self.leader:
            current = self._current_view()
            me = (self.name, os.getpid(), self._ticket)
            if current is not None and current.generation > self._generation and me not in current.members:
                return "the leader re-formed the group without this rank"
        return None

    def _destroy(self) -> None:
        """Leave the current group, if any, without waiting for it (see the module docstring)."""
        if self.group is not None:
            self._set_aside.append((self.group.group, self._pending))
            self.group, self._pending = None, None
            set_data_parallel_group(None)
        # Groups whose last operation has completed can go (their threads are idle).
        self._set_aside = [(group, work) for group, work in self._set_aside
                           if work is not None and not work.is_completed()]
        if not self.leader:
            self.rank, self.world = 0, 1


def _serialise(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _deserialise(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), weights_only=False)
