"""The ``relayrl`` command line."""
