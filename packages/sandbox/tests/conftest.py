import pytest

from relayrl.core.testing.fixtures import builtin_plugins_only  # noqa: F401
from relayrl.sandbox.testing.fixtures import backend  # noqa: F401


@pytest.fixture(autouse=True)
def _builtin_plugins_only(builtin_plugins_only):  # noqa: F811 - the imported fixture, requested
    """Registries hold exactly the built-ins here, whatever third-party plugins are installed."""
