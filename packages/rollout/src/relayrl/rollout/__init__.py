"""relayrl-rollout: engines, routers, the token-recording proxy, agent loops, the rollout manager.

Submodules are imported on use, so that loading the plugin does not import torch.
"""
