"""The namespace holder's read-only pass when other sandboxes come and go while it runs.

The holder lists the host's mounts, then remounts each read-only; another sandbox's workspace can be
unmounted and removed between the two. Those runs need root and real namespaces; the decision itself
(skip what is no longer mounted, fail on anything else) is tested here with mount(2) replaced.
"""

from __future__ import annotations

import errno

import pytest

from relayrl.sandbox import holder


def _fake_mounts(monkeypatch, listings, failing):
    """``mount_points()`` returns each of ``listings`` in turn (the last one from then on); remounting a
    point in ``failing`` raises its errno."""
    calls = iter(listings)
    last = {"value": listings[-1]}

    def mount_points(mountinfo: str = "/proc/self/mountinfo"):
        last["value"] = next(calls, last["value"])
        return last["value"]

    def mount(source, target, fstype, flags, data=None):
        if target in failing:
            raise OSError(failing[target], f"mount {target}: {errno.errorcode[failing[target]]}")

    monkeypatch.setattr(holder, "mount_points", mount_points)
    monkeypatch.setattr(holder, "_mount", mount)


def test_a_mount_that_vanished_after_the_listing_is_skipped(monkeypatch, tmp_path):
    gone = str(tmp_path / "other-sandbox" / "workspace")
    _fake_mounts(monkeypatch, [[("/", "rw"), (gone, "rw")], [("/", "rw")]], {gone: errno.EINVAL})
    assert holder._make_read_only([]) == []


def test_a_mount_that_is_still_there_and_refuses_fails_the_sandbox(monkeypatch, tmp_path):
    stays = str(tmp_path / "stubborn")   # not a directory: it cannot be covered by a tmpfs either
    _fake_mounts(monkeypatch, [[("/", "rw"), (stays, "rw")]], {stays: errno.EINVAL})
    with pytest.raises(OSError, match="stubborn"):
        holder._make_read_only([])


def test_the_root_failing_always_fails_the_sandbox(monkeypatch):
    _fake_mounts(monkeypatch, [[("/", "rw")], []], {"/": errno.EINVAL})
    with pytest.raises(OSError):
        holder._make_read_only([])
