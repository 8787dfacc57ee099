"""relayrl-reasoning-gym: every reasoning-gym dataset as a relayrl environment (``reasoning-gym``).

The environment lives in :mod:`relayrl_reasoning_gym.environment`; this package imports nothing
heavy, so that loading plugins stays cheap (reasoning_gym takes about a second to import).
"""
