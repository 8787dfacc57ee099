"""Heartbeats and membership of data-parallel replicas, through a store.

Each replica runs a :class:`Heartbeat` that rewrites ``<prefix>/members/<id>`` every
``interval_s`` with its wall-clock time; a member is *alive* while its last beat is younger than
``ttl_s``. The *view* (``<prefix>/view``: a generation number and the ordered member list) is
written by one replica at a time: the current group's rank 0 when it admits newcomers at a step
boundary, the first surviving member after a failure, and the smallest alive id when there is no
group yet. Existing members keep their order, so rank 0, the replica every other one copies its
state from, is never a newcomer. Every replica of a generation agrees on its rank (its position in
the list) and world size.

Any relayrl store works (a shared directory, S3, a peer's HTTP store); on one machine the tests
use a directory. Clocks of the replicas must agree to well under ``ttl_s`` (NTP does).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from relayrl.core.errors import ObjectNotFound
from relayrl.core.store import Store

__all__ = ["Heartbeat", "StoreMembership", "View"]


class View(msgspec.Struct, frozen=True, kw_only=True):
    """One generation of the replica group: who is in it, in rank order."""

    generation: int
    members: list[str]
    """Rank order: existing members keep their ranks, newcomers come last (rank 0 is the state source)."""
    time: float = 0.0
    """When it was published: a replica that (re)starts only joins views newer than itself."""

    def rank(self, member_id: str) -> int:
        return self.members.index(member_id)

    @property
    def world_size(self) -> int:
        return len(self.members)


class StoreMembership:
    """Membership of replicas through ``store`` (see the module docstring). Built-in ``store`` kind."""

    def __init__(self, store: Store, *, prefix: str = "membership", ttl_s: float = 3.0) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.ttl_s = ttl_s

    def beat(self, member_id: str) -> None:
        self.store.put(f"{self.prefix}/members/{member_id}", json.dumps({"time": time.time()}).encode())

    def leave(self, member_id: str) -> None:
        self.store.delete(f"{self.prefix}/members/{member_id}")

    def alive(self) -> list[str]:
        """Members whose last beat is younger than ``ttl_s``, sorted by id."""
        now, members = time.time(), []
        for key in self.store.list(f"{self.prefix}/members/"):
            try:
                beat = json.loads(self.store.get(key))["time"]
            except (ObjectNotFound, ValueError, KeyError):
                continue
            if now - beat < self.ttl_s:
                members.append(key.rsplit("/", 1)[1])
        return sorted(members)

    def view(self) -> View | None:
        try:
            return msgspec.json.decode(self.store.get(f"{self.prefix}/view"), type=View)
        except ObjectNotFound:
            return None

    def propose(self, members: Sequence[str], *, after: int | None = None) -> View | None:
        """Publish ``members`` (in rank order) as the next generation; the caller is the one proposer.

        Returns the new view, or None when the current view already has these members (and, given
        ``after``, a generation newer than ``after``: a group whose collective failed re-forms even
        when nobody left).
        """
        members = list(members)
        current = self.view()
        if current is not None and current.members == members and (after is None or current.generation > after):
            return None
        view = View(generation=(current.generation + 1) if current else 1, members=members, time=time.time())
        self.store.put(f"{self.prefix}/view", msgspec.json.encode(view))
        return view


class Heartbeat:
    """Beats for ``member_id`` every ``interval_s`` on a daemon thread until :meth:`stop`."""

    def __init__(self, membership: Any, member_id: str, *, interval_s: float = 0.5) -> None:
        self.membership, self.member_id, self.interval_s = membership, member_id, interval_s
        self._stop = threading.Event()
        membership.beat(member_id)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{member_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.membership.beat(member_id=self.member_id)
            except Exception:  # a store hiccup: the next beat retries; a long outage reads as death
                continue

    def stop(self, *, leave: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if leave:
            self.membership.leave(self.member_id)
