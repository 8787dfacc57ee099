"""Errors of relayrl-weight-sync; all are :class:`relayrl.core.errors.RelayrlError` subclasses."""

from __future__ import annotations

from relayrl.core.errors import RelayrlError, WireError


class WeightSyncError(RelayrlError):
    """A weight version could not be published, decoded or applied; the message names it."""


class BitMismatch(WeightSyncError):
    """The bits a decode or an apply produced differ from the checksum the manifest records."""


class CorruptManifest(WeightSyncError, WireError):
    """A manifest that decodes (and passes its checksum) but cannot be true: a version other than its
    key's, or a delta whose parent is not an older version (a loop or a forward link). Readers treat it
    like any other unreadable object, so every walk down a parent chain is finite."""


class VersionUnavailable(WeightSyncError):
    """No complete version (or no usable chain of versions) is available in the store."""


class ConcurrentWriter(WeightSyncError):
    """Another publisher committed a version this one was writing: two trainers share one bus.

    Retrying cannot help (the other writer keeps going); a supervisor stops instead of restarting.
    """
