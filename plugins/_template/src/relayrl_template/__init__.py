"""relayrl-template: a ready-to-copy relayrl plugin (an in-process object-store backend)."""

from relayrl_template.store import DictStore

__all__ = ["DictStore"]
