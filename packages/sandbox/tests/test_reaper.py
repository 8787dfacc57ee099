"""Sandboxes of owners killed by SIGKILL are reaped; a live owner's never are."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from relayrl.core.processes import boot_id
from relayrl.sandbox.api import SandboxUnavailable
from relayrl.sandbox.local import default_root
from relayrl.sandbox.process import ProcessBackend
from relayrl.sandbox.reaper import OWNER_FILE, reap_stale

pytestmark = pytest.mark.skipif(not boot_id(), reason="telling dead owners apart needs Linux /proc and a boot id")

OWNER = textwrap.dedent("""
    import json, sys
    from relayrl.sandbox.process import ProcessBackend
    sandbox = ProcessBackend(root=sys.argv[1], require=[]).create()
    assert sandbox.exec("echo hi > note && sleep 0").exit_status == 0
    holder = sandbox.namespace_holder
    print(json.dumps({"id": sandbox.id, "uid": sandbox.uid, "holder": holder.pid if holder else None,
                      "cgroup": [str(p) for p in sandbox.cgroup.directories] if sandbox.cgroup else []}), flush=True)
    sys.stdin.read()  # until killed
""")


@pytest.fixture
def root():
    # Not under /tmp: commands get a private /tmp, and backends refuse a root below it.
    path = Path(default_root()).parent / f"reaper-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_a_sigkilled_owners_sandbox_is_reaped_at_the_next_start_and_a_live_one_is_kept(root):
    try:
        backend = ProcessBackend(root=str(root), require=[])
    except SandboxUnavailable as exc:
        pytest.skip(f"process backend unavailable: {exc}")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    leaked = json.loads(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    directory = root / leaked["id"]
    # What a SIGKILL leaves behind: the directory (and, as far as this host allows, the workspace
    # tmpfs, the uid claim, the cgroups and the namespace holder).
    assert (directory / OWNER_FILE).exists()
    mounted = os.path.ismount(directory / "workspace")
    claim = root / ".uids" / str(leaked["uid"]) if leaked["uid"] is not None else None
    assert claim is None or claim.read_text() == leaked["id"]
    holder = leaked["holder"]
    print(f"leaked: tmpfs={mounted} uid={leaked['uid']} cgroups={len(leaked['cgroup'])} "
          f"holder={holder and _alive(holder)}")
    capabilities = backend.capabilities()  # each leak this host's sandboxes can have, it had
    assert mounted == ("disk-quota" in capabilities) and (claim is not None) == ("unprivileged" in capabilities)
    assert bool(leaked["cgroup"]) == bool({"memory-limit", "process-limit"} & capabilities)
    assert not backend._persistent() or _alive(holder)

    live = backend.create()  # the first sandbox this process creates under root reaps the dead owner's
    assert not directory.exists() and not os.path.ismount(directory / "workspace")
    assert claim is None or not claim.exists()
    assert not any(Path(path).exists() for path in leaked["cgroup"])
    assert holder is None or not _alive(holder)
    # The live owner's sandbox is untouched and still works.
    assert live.directory.exists() and live.exec("echo ok").stdout.strip() == "ok"
    assert reap_stale(root) == []
    live.close()
    assert not live.directory.exists()
