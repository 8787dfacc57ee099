"""relayrl-bwrap: a bubblewrap sandbox backend for relayrl."""

from relayrl_bwrap.backend import BwrapBackend

__all__ = ["BwrapBackend"]
