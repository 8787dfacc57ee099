"""relayrl-template: a ready-to-copy relayrl plugin (see ``plugin.py`` for what it registers)."""
