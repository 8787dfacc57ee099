import pytest
import torch

from relayrl.core.testing.fixtures import builtin_plugins_only  # noqa: F401


@pytest.fixture(autouse=True)
def _restore_torch_process_state():
    """enable_determinism() flips process-wide switches; keep tests independent of their order."""
    threads = torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _builtin_plugins_only(builtin_plugins_only):  # noqa: F811 - the imported fixture, requested
    """Registries hold exactly the built-ins here, whatever third-party plugins are installed."""
