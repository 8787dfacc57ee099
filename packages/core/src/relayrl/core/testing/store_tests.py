"""``StoreTests``: the conformance suite every object-store backend passes.

Subclass it in a test module and override the ``store`` fixture (a fresh, empty store per test);
override ``reopen`` when a second client of the same location is not ``open_store(store.url)``::

    from relayrl.core.testing import StoreTests

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(f"my://{tmp_path}")

Tests that need several processes (the SIGKILL test) skip, saying why, for stores whose
``shared_across_processes`` is False.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from relayrl.core.errors import ChecksumMismatch, ObjectExists, ObjectNotFound, StoreError
from relayrl.core.store import Store, open_store
from relayrl.core.store.base import TEMP_MARKER
from relayrl.core.testing.kill_writer import check_object


class StoreTests:
    """Conformance suite for :class:`relayrl.core.store.Store` backends."""

    #: Size of the "large object" round trip; big enough to cross multipart thresholds if raised.
    large_object_bytes = 48 * 1024 * 1024
    #: How many times the SIGKILL test kills a writer (``RELAYRL_KILL_ITERATIONS`` overrides).
    kill_iterations = 20
    #: Largest object the killed writer writes.
    kill_max_bytes = 4 * 1024 * 1024

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("override the `store` fixture to return a fresh, empty store")

    @pytest.fixture
    def reopen(self):
        """A function opening a second, independent client of the same store."""
        return lambda store: open_store(store.url)

    # --------------------------------------------------------------------------- basics
    def test_round_trip_of_bytes_like_values(self, store: Store) -> None:
        for index, value in enumerate([b"", b"x", bytearray(b"bytearray"), memoryview(b"a view"), os.urandom(100_000)]):
            info = store.put(f"k{index}", value)
            assert store.get(f"k{index}") == bytes(value)
            assert info.size == len(value)
            assert store.stat(f"k{index}") == info

    def test_missing_object_raises_not_found_naming_the_key(self, store: Store) -> None:
        for operation in (lambda: store.get("no/such/object"), lambda: store.stat("no/such/object"),
                          lambda: store.get_range("no/such/object", 0, 1)):
            with pytest.raises(ObjectNotFound, match="no/such/object"):
                operation()
        assert not store.exists("no/such/object")
        store.delete("no/such/object")  # missing_ok by default
        with pytest.raises(ObjectNotFound, match="no/such/object"):
            store.delete("no/such/object", missing_ok=False)

    def test_conditional_create_succeeds_once(self, store: Store) -> None:
        store.put("manifest", b"first", if_absent=True)
        with pytest.raises(ObjectExists, match="manifest"):
            store.put("manifest", b"second", if_absent=True)
        assert store.get("manifest") == b"first"

    def test_conditional_create_has_one_winner_among_racing_threads(self, store: Store) -> None:
        winners: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def attempt(index: int) -> None:
            barrier.wait()
            try:
                store.put("race", str(index).encode(), if_absent=True)
                winners.append(index)
            except ObjectExists:
                pass
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=attempt, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert len(winners) == 1
        assert store.get("race") == str(winners[0]).encode()

    def test_overwrite_replaces_content(self, store: Store) -> None:
        store.put("latest", b"1")
        store.put("latest", b"2")
        assert store.get("latest") == b"2"

    def test_list_after_write_with_prefixes_sorted(self, store: Store, reopen) -> None:
        keys = ["a/b/1", "a/b/2", "a/bc", "a/c/3", "z"]
        for key in reversed(keys):
            store.put(key, key.encode())
        other = reopen(store)
        for client in (store, other):
            assert client.list() == keys
            assert client.list("a/") == keys[:4]
            assert client.list("a/b/") == ["a/b/1", "a/b/2"]
            assert client.list("a/b") == ["a/b/1", "a/b/2", "a/bc"]
            assert client.list("nothing/") == []
        assert other.get("a/bc") == b"a/bc"

    def test_delete_removes_from_listing(self, store: Store) -> None:
        store.put("x/1", b"1")
        store.put("x/2", b"2")
        store.delete("x/1")
        assert store.list("x/") == ["x/2"]
        assert not store.exists("x/1")

    def test_child_store_shares_the_namespace(self, store: Store) -> None:
        child = store.child("weights")
        child.put("manifest-1", b"m")
        assert store.list() == ["weights/manifest-1"]
        assert store.get("weights/manifest-1") == b"m"
        assert child.list() == ["manifest-1"]

    def test_invalid_keys_are_refused_by_name(self, store: Store) -> None:
        for key in ["", "/abs", "a//b", "../escape", "a/./b", f"x{TEMP_MARKER}y"]:
            with pytest.raises(StoreError, match="invalid object key"):
                store.put(key, b"x")

    def test_range_reads(self, store: Store) -> None:
        data = bytes(range(256)) * 10
        store.put("blob", data)
        assert store.get_range("blob", 0, 10) == data[:10]
        assert store.get_range("blob", 1000, 1560) == data[1000:]
        assert store.get_range("blob", 5, 0) == b""
        with pytest.raises(StoreError, match="past its end"):
            store.get_range("blob", 2000, 1000)

    def test_large_object_round_trip(self, store: Store) -> None:
        data = random.Random(7).randbytes(1 << 20) * (self.large_object_bytes >> 20)
        info = store.put("large", data)
        assert info.size == len(data)
        assert store.get("large") == data
        assert store.get_range("large", len(data) - 5, 5) == data[-5:]

    # --------------------------------------------------------------------------- integrity
    def test_corrupt_and_truncated_objects_are_detected(self, store: Store) -> None:
        data = os.urandom(10_000)
        store.put("victim", data)
        path = store._path("victim")
        raw = store._read(path)
        flipped = bytearray(raw)
        flipped[123] ^= 0x01
        store._write(path, [bytes(flipped)], if_absent=False)
        with pytest.raises(ChecksumMismatch, match="victim"):
            store.get("victim")
        store._write(path, [raw[: len(raw) // 2]], if_absent=False)
        with pytest.raises(ChecksumMismatch, match="victim"):
            store.get("victim")
        store._write(path, [raw[:10]], if_absent=False)
        with pytest.raises(ChecksumMismatch, match="victim"):
            store.get("victim")

    def test_readers_never_see_partial_objects_while_a_writer_overwrites(self, store: Store) -> None:
        from relayrl.core.testing.kill_writer import expected_content

        sizes = [3 << 20, 1 << 20, 2 << 20]
        payloads = [expected_content(index, size) for index, size in enumerate(sizes)]
        store.put("hot", payloads[0])
        stop = threading.Event()
        seen: set[int] = set()
        failures: list[BaseException] = []

        def read_loop() -> None:
            while not stop.is_set():
                try:
                    seen.add(check_object(store.get("hot")))
                except BaseException as exc:
                    failures.append(exc)
                    return

        reader = threading.Thread(target=read_loop)
        reader.start()
        try:
            for round_ in range(30):
                store.put("hot", payloads[round_ % len(payloads)])
        finally:
            stop.set()
            reader.join()
        assert not failures, failures[0]
        assert seen, "the reader never completed a read"

    # --------------------------------------------------------------------------- crash safety
    def test_sigkilled_writers_never_leave_partial_objects(self, store: Store) -> None:
        if not store.shared_across_processes:
            pytest.skip(f"{type(store).__name__} cannot be opened from another process")
        iterations = int(os.environ.get("RELAYRL_KILL_ITERATIONS", self.kill_iterations))
        rng = random.Random(20261129)
        completed_writes = 0
        for iteration in range(iterations):
            writer = subprocess.Popen(
                [sys.executable, "-m", "relayrl.core.testing.kill_writer", store.url, str(iteration + 1),
                 str(self.kill_max_bytes)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            assert writer.stdout is not None
            # Wait for the first completed write, then kill at a random moment during later ones.
            first = writer.stdout.readline()
            if not first:
                raise AssertionError(f"writer failed: {writer.stderr.read().decode() if writer.stderr else ''}")
            time.sleep(rng.uniform(0.0, 0.4))
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            completed_writes += 1 + len((writer.stdout.read() or b"").splitlines())
            writer.stdout.close()
            if writer.stderr:
                writer.stderr.close()
            self._assert_every_visible_object_is_complete(store)
        assert completed_writes >= iterations
        if store.writes_temporaries:
            # Temporaries left behind prove that kills landed mid-write, i.e. the test tested something.
            assert store.sweep_temporaries(older_than_s=0) > 0, "no kill interrupted a write; raise kill_iterations"

    @staticmethod
    def _assert_every_visible_object_is_complete(store: Store) -> None:
        keys = store.list()
        assert "hot" in keys
        for key in keys:
            check_object(store.get(key))
