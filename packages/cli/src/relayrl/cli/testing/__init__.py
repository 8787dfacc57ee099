"""Conformance suites for the ``relayrl`` command's plugin kinds: ``LauncherTests`` for launchers.

Install with ``relayrl[testing]``; subclass the suite in your plugin's tests (see each class)."""

from relayrl.cli.testing.launcher_tests import LauncherTests

__all__ = ["LauncherTests"]
