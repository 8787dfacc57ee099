"""The exception hierarchy shared by every relayrl package.

Every error a user can cause (a bad config key, a missing object, a broken plugin) is a
:class:`RelayrlError` whose message names the thing at fault (field, file, object or plugin), so
that the command line can print it as one line and exit without a traceback.
"""

from __future__ import annotations


class RelayrlError(Exception):
    """Base class of every error relayrl raises on purpose."""


class PluginError(RelayrlError):
    """A plugin failed to load, implements an unknown hook, or registers a name twice."""


class ConfigError(RelayrlError):
    """A config file or override is invalid; the message starts with the dotted key path."""


class WireError(RelayrlError):
    """A wire message could not be decoded (corrupt bytes, wrong type, newer schema)."""


class StoreError(RelayrlError):
    """An object-store operation failed permanently (after retries, where retrying made sense)."""


class ObjectNotFound(StoreError, KeyError):
    """The object does not exist (or is not yet visible)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "object not found"


class ObjectExists(StoreError):
    """A conditional create found the object already present."""


class ChecksumMismatch(StoreError):
    """The bytes read back do not match the checksum written with them."""
