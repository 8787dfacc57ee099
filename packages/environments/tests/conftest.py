import pytest

from relayrl.core.testing.fixtures import builtin_plugins_only  # noqa: F401


@pytest.fixture(autouse=True)
def _builtin_plugins_only(builtin_plugins_only):  # noqa: F811 - the imported fixture, requested
    """Registries hold exactly the built-ins here, whatever third-party plugins are installed."""


@pytest.fixture
def backend():
    """A process backend with whatever isolation this host allows (tests needing more skip by capability)."""
    from relayrl.sandbox.api import Limits, SandboxUnavailable
    from relayrl.sandbox.process import ProcessBackend

    try:
        return ProcessBackend(limits=Limits(wall_time_s=30, cpu_time_s=20, memory_bytes=512 * 1024**2,
                                            disk_bytes=64 * 1024**2), require=[])
    except SandboxUnavailable as exc:  # network-none is implied by the default network = "none"
        pytest.skip(f"the process backend cannot start on this host: {exc}")


@pytest.fixture
def tasks():
    """The shipped bug-fix tasks by id."""
    from relayrl.environments.bugfix import shipped_tasks

    return {task.task_id: task for task in shipped_tasks()}
