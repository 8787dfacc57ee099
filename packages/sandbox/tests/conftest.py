import pytest

from relayrl.core.plugins import reset_plugin_manager


@pytest.fixture(autouse=True)
def _builtin_plugins_only(monkeypatch):
    """Registries hold exactly the built-ins here, whatever third-party plugins are installed."""
    monkeypatch.setenv("RELAYRL_LOAD_PLUGINS", "")
    reset_plugin_manager()
    yield
    reset_plugin_manager()
