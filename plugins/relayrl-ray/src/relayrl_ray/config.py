"""``[launcher] options`` of the ``ray`` launcher."""

from __future__ import annotations

import msgspec

from relayrl.core.config import ConfigError, Section
from relayrl.core.plugins import PluginManager

__all__ = ["RayLauncherOptions", "RoleResources"]

ROLES = ("trainer", "engine", "mirror", "rollout")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class RoleResources(Section, kw_only=True):
    """What one process of a role needs from a Ray node (Ray schedules by these; the process itself
    is not confined to them)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = msgspec.field(default_factory=dict)
    """Custom resources: a label a node was started with (``ray start --resources='{"rollout": 4}'``)
    pins the role to such nodes."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        for key, value in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                           *((f"resources.{name}", amount) for name, amount in self.resources.items())):
            if not value >= 0:
                raise ConfigError(f"{path}.{key}: must be >= 0, got {value}")


class RayLauncherOptions(Section, kw_only=True):
    """``[launcher] backend = "ray"``: ``[launcher.options]``."""

    address: str = "auto"
    """The cluster (``ray.init(address=...)``): ``auto`` finds the one ``ray start`` runs on this
    machine; ``HOST:PORT`` a head node's GCS address; ``local`` starts a one-node cluster for the run."""
    namespace: str = "relayrl"
    """The Ray namespace the run's actors are created in."""
    roles: dict[str, RoleResources] = msgspec.field(default_factory=dict)
    """Per role (``trainer`` for each rank, ``engine``, ``mirror``, ``rollout``); absent: one CPU."""
    trainer_strategy: str = "PACK"
    """How the trainer ranks' placement group spreads them over nodes (Ray's strategies)."""
    place_timeout_s: float = 300.0
    """How long to wait for a node with a role's resources before the run fails."""
    forward_env: list[str] = msgspec.field(default_factory=lambda: ["RELAYRL_"])
    """Prefixes of the launcher's environment variables every process also gets (the rest of its
    environment is the Ray worker's on that node)."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        for role, resources in self.roles.items():
            if role not in ROLES:
                raise ConfigError(f"{path}.roles.{role}: not a role (roles: {', '.join(ROLES)})")
            resources.check(pm, f"{path}.roles.{role}")
        if self.trainer_strategy not in STRATEGIES:
            raise ConfigError(f"{path}.trainer_strategy: one of {', '.join(STRATEGIES)}, got {self.trainer_strategy!r}")
        if not self.place_timeout_s > 0:
            raise ConfigError(f"{path}.place_timeout_s: must be > 0")
        if not self.address:
            raise ConfigError(f"{path}.address: empty (auto, local, or HOST:PORT)")

    def role(self, name: str) -> RoleResources:
        return self.roles.get(name) or RoleResources()
