pytest_plugins = ["relayrl.core.testing.fixtures"]
