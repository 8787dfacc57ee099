"""relayrl-dualclip: dual-clip PPO as a relayrl loss plugin.

The loss lives in :mod:`relayrl_dualclip.loss` (it imports torch); this package imports nothing
heavy, so that loading plugins stays cheap and works where torch is absent.
"""
