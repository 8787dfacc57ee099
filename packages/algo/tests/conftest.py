import pytest
import torch

from relayrl.core.plugins import reset_plugin_manager


@pytest.fixture(autouse=True)
def _restore_torch_process_state():
    """enable_determinism() flips process-wide switches; keep tests independent of their order."""
    threads = torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _builtin_plugins_only(monkeypatch):
    """Registries hold exactly the built-ins here, whatever third-party plugins are installed."""
    monkeypatch.setenv("RELAYRL_LOAD_PLUGINS", "")
    reset_plugin_manager()
    yield
    reset_plugin_manager()
