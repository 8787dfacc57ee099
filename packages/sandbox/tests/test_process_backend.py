"""The built-in ``process`` backend passes the sandbox conformance suite."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from relayrl.sandbox.api import SandboxUnavailable
from relayrl.sandbox.host import host_support
from relayrl.sandbox.process import ProcessBackend
from relayrl.sandbox.testing import SandboxTests, TrackedSandbox


def _backend(**kwargs) -> ProcessBackend:
    try:
        return ProcessBackend(**kwargs)
    except SandboxUnavailable as exc:  # pragma: no cover - depends on the host
        pytest.skip(f"process backend unavailable on this host: {exc}")


class TestProcessBackend(SandboxTests):
    @pytest.fixture
    def backend(self):
        return _backend(limits=self.limits)


def test_missing_capability_refuses_to_start_with_the_reason(monkeypatch):
    class NoCgroups(ProcessBackend):
        def probe(self, support):
            provided, reasons = super().probe(support)
            provided -= {"memory-limit", "process-limit"}
            reasons["memory-limit"] = reasons["process-limit"] = "cgroups hidden by this test"
            return provided, reasons

    with pytest.raises(SandboxUnavailable, match=r"memory-limit .*cgroups hidden by this test"):
        NoCgroups(require=["memory-limit"])
    assert "memory-limit" not in NoCgroups(require=[]).capabilities()


def test_network_host_is_an_explicit_choice_and_drops_network_none():
    backend = _backend(network="host", require=[])
    assert "network-none" not in backend.capabilities()
    with pytest.raises(SandboxUnavailable, match="network-none"):
        ProcessBackend(network="host", require=["network-none"])


def test_capabilities_match_the_host_probe():
    support = host_support()
    backend = _backend(require=[])
    assert ("memory-limit" in backend.capabilities()) == (support.cgroup is not None)
    assert ("pid-isolation" in backend.capabilities()) == support.namespaces


def test_root_under_a_private_mount_is_refused(tmp_path):
    from relayrl.sandbox.api import SandboxError

    with pytest.raises(SandboxError, match="private"):
        ProcessBackend(root=str(tmp_path / "sandboxes"), require=[])


def test_a_timeout_beyond_the_wall_time_limit_is_clamped_to_it():
    from relayrl.sandbox.api import Limits

    backend = _backend(limits=Limits(wall_time_s=1), require=[])
    with backend.create() as sandbox:
        result = sandbox.exec("sleep 600", timeout=10_000)
    assert result.timed_out and result.killed_reason == "timeout"


def host_directory() -> Path:
    """A directory outside /tmp (private in every sandbox) where this user may create files."""
    return Path("/var/lib") if os.access("/var/lib", os.W_OK) else Path.home()


def test_masks_skip_paths_inside_masked_or_private_directories(tmp_path):
    data = host_directory() / f"relayrl-masks-{uuid.uuid4().hex}"  # outside the private /tmp
    (data / "task").mkdir(parents=True)
    try:
        (data / "task" / "gold.patch").write_text("")
        (data / "other.patch").write_text("")
        # Masks matter inside what a sandbox sees: the data folder is exposed to it here.
        backend = _backend(require=[], hide_paths=[str(data / "task")], expose_paths=[str(data)])
        hide = [data / "task" / "gold.patch", data / "other.patch", data / "absent", tmp_path / "under-tmp"]
        (tmp_path / "under-tmp").mkdir()
        with backend.create(hide=hide) as sandbox:
            directories, files = backend.masks(sandbox)
            (data / "other.patch").write_text("visible on the host")
            result = sandbox.exec(f"cat {data}/other.patch; ls -A {data}/task | wc -l")
    finally:
        shutil.rmtree(data)
    assert str(data / "task") in directories and files == [str(data / "other.patch")]
    assert not [path for path in directories if path.startswith((str(data / "task") + "/", str(tmp_path)))]
    assert result.stdout == "0\n"  # the file reads empty, the directory lists empty


def test_without_root_the_user_namespace_chain_isolates_network_and_processes(monkeypatch):
    """The fallback a non-root user gets, run for real: user + network + PID namespaces, rlimits."""
    import dataclasses

    from relayrl.sandbox import host

    support = host.host_support()
    if not support.user_namespace:
        pytest.skip(f"user namespaces are unavailable here: {support.reasons.get('user_namespace')}")
    as_user = dataclasses.replace(support, root=False, setpriv=False, tmpfs=False, cgroup=None,
                                  reasons={"setpriv": "not root", "tmpfs": "not root", "cgroup": "not root"})
    monkeypatch.setattr("relayrl.sandbox.local.host_support", lambda: as_user)
    backend = ProcessBackend(require=["network-none", "pid-isolation", "tree-kill", "readonly-system"])
    assert backend.capabilities() == {"network-none", "pid-isolation", "tree-kill", "readonly-system"}
    with pytest.raises(SandboxUnavailable, match="unprivileged .*not root"):
        ProcessBackend(require=["unprivileged"])
    with backend.create() as raw:
        sandbox = TrackedSandbox(raw)
        result = sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\" "
                              "2>&1 | tail -1; ls /proc | grep -c '^[0-9]'; (sleep 600 &); echo done")
        assert "unreachable" in result.stdout.lower() and int(result.stdout.split()[-2]) < 10
        assert not sandbox.strays()
        # Uid 0 of its own user namespace, without a capability: the host stays read-only.
        result = sandbox.exec("echo ok > mine; cat mine; touch /etc/relayrl-x 2>&1; mount -o remount,rw / 2>&1; "
                              "umount /tmp 2>&1; grep CapEff /proc/self/status")
        assert result.stdout.startswith("ok\n") and "Read-only file system" in result.stdout
        assert "CapEff:\t0000000000000000" in result.stdout and not Path("/etc/relayrl-x").exists()


def test_a_zero_rlimit_means_no_limit():
    from relayrl.sandbox.api import Limits

    backend = _backend(limits=Limits(cpu_time_s=0, max_file_bytes=0, max_open_files=0), require=[])
    assert not [arg for arg in backend.rlimit_args() if arg.startswith(("--cpu", "--fsize", "--nofile"))]
    with backend.create() as sandbox:
        assert sandbox.exec("echo fine").stdout == "fine\n"


def test_a_sandbox_that_fails_to_start_leaves_nothing_behind():
    from relayrl.sandbox.api import SandboxError

    missing = Path()

    class SeeingAVanishedPath(ProcessBackend):
        def visible(self):  # a path gone between the listing and the bind mount: the set-up fails
            return [*super().visible(), str(missing)]

    backend = _backend(require=[])
    if "readonly-system" not in backend.capabilities():
        pytest.skip(f"needs 'readonly-system' (the namespace set-up is what fails): {backend.reasons}")
    failing = SeeingAVanishedPath(require=[])
    failing.root.mkdir(parents=True, exist_ok=True)
    missing = failing.root / f"vanished-{uuid.uuid4().hex}"

    def mounts_under_root():  # compared before and after: sandboxes of other tests may still await GC
        return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(str(failing.root) + "/")}

    entries, mounts = set(failing.root.iterdir()), mounts_under_root()
    with pytest.raises(SandboxError, match="cannot set up the sandbox's namespaces"):
        failing.create()
    # Only what is new counts: another test's sandbox may be collected (and vanish) meanwhile.
    assert (set(failing.root.iterdir()) - entries, mounts_under_root() - mounts) == (set(), set())
