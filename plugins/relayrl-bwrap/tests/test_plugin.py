"""The bwrap backend passes relayrl's sandbox conformance suite and is discoverable by name."""

from __future__ import annotations

import pytest

from relayrl.core.plugins import create_plugin_manager
from relayrl.environments.testing import GraderTests, KernelExploitTests
from relayrl.sandbox.api import SandboxUnavailable
from relayrl.sandbox.config import SandboxSection, open_backend
from relayrl.sandbox.hookspecs import SANDBOX_BACKENDS
from relayrl.sandbox.local import SETUP_ATTEMPTS
from relayrl.sandbox.testing import SandboxTests
from relayrl_bwrap.backend import BwrapBackend, probe_bwrap
from relayrl_bwrap.plugin import NAME


def _backend(**kwargs) -> BwrapBackend:
    works, reason = probe_bwrap(False)
    if not works:
        pytest.skip(f"bubblewrap cannot run here: {reason}")
    try:
        return BwrapBackend(**kwargs)
    except SandboxUnavailable as exc:
        pytest.skip(f"bwrap backend unavailable on this host: {exc}")


class TestBwrapBackend(SandboxTests):
    @pytest.fixture
    def backend(self):
        return _backend(limits=self.limits)


def test_registered_through_the_entry_point():
    record = SANDBOX_BACKENDS.registrations(create_plugin_manager())[NAME]
    assert record.plugin == "relayrl-bwrap" and record.factory is BwrapBackend


def test_selected_by_the_config_section():
    _backend(require=[])
    backend = open_backend(section=SandboxSection(backend=NAME, require=[]))
    assert isinstance(backend, BwrapBackend)


def test_other_sandboxes_are_hidden_not_just_unreadable():
    backend = _backend(require=[])
    with backend.create() as first, backend.create() as second:
        result = first.exec(f"ls {backend.root}; ls {second.workdir} 2>&1")
        assert second.id not in result.stdout.split("\n")[0] and "No such file" in result.stdout


def test_refuses_to_start_without_bwrap(monkeypatch):
    monkeypatch.setattr("relayrl_bwrap.backend.probe_bwrap", lambda as_other_uid: (False, "bwrap is not installed"))
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        BwrapBackend(require=["network-none"])


class TestBwrapBackendGrading(GraderTests):
    @pytest.fixture
    def backend(self):
        return _backend(limits=GraderTests.limits, require=[])


class _FailsSetUpOnce(BwrapBackend):
    """bwrap whose first set-up fails (a bind of a missing path), as a vanished host mount makes it."""

    set_up_failures = 1

    def wrap(self, sandbox, argv, cwd, *, start_fd=None):
        wrapped = super().wrap(sandbox, argv, cwd, start_fd=start_fd)
        if self.set_up_failures > 0:
            self.set_up_failures -= 1
            separator = wrapped.index("--", wrapped.index("bwrap"))
            wrapped[separator:separator] = ["--ro-bind", "/nonexistent-relayrl-test", "/mnt/missing"]
        return wrapped


def test_a_set_up_that_failed_before_the_command_started_is_retried():
    _backend(require=[])
    backend = _FailsSetUpOnce(require=[])
    with backend.create() as sandbox:
        result = sandbox.exec("echo ran >> runs; cat runs")
        assert result.exit_status == 0 and result.stdout == "ran\n", result
        assert backend.set_up_failures == 0


def test_a_command_that_failed_by_itself_runs_once():
    backend = _backend(require=[])
    with backend.create() as sandbox:
        result = sandbox.exec("echo ran >> runs; echo 'bwrap: Can not mount' >&2; exit 1")
        assert result.exit_status == 1
        assert sandbox.read_file("runs") == b"ran\n"
        missing = sandbox.exec(["/nonexistent-command"])  # exec fails after the set-up: not retried either
        assert missing.exit_status != 0 and "nonexistent-command" in missing.stderr


def test_a_set_up_that_always_fails_is_reported_after_the_last_attempt():
    _backend(require=[])
    backend = _FailsSetUpOnce(require=[])
    backend.set_up_failures = 10
    with backend.create() as sandbox:
        result = sandbox.exec("true")
        assert result.exit_status != 0 and "nonexistent-relayrl-test" in result.stderr
        assert backend.set_up_failures == 10 - SETUP_ATTEMPTS


class TestBwrapBackendKernelExploits(KernelExploitTests):
    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls):
        return _backend(require=[])
