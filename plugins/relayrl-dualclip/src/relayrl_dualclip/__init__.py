"""relayrl-dualclip: dual-clip PPO as a relayrl loss plugin."""

from relayrl_dualclip.loss import DualClipPPO

__all__ = ["DualClipPPO"]
