"""Where engines register and how requests travel: :class:`DynamoSettings` and :func:`create_runtime`.

Dynamo's runtime is configured by environment variables read when a ``DistributedRuntime`` is
created; :func:`create_runtime` sets them from the settings first, so one process can hold several
runtimes (an in-process router serving several engines, tests). Defaults need no infrastructure:

* discovery ``file`` (a shared directory; every process of a deployment on one host or a shared
  filesystem sees the same registrations) or ``etcd`` (production); ``mem`` keeps registrations
  inside one runtime, so it holds a single instance (each runtime is one instance);
* the TCP request plane, advertised on ``host`` (127.0.0.1 by default: without it workers advertise
  a non-loopback address), and the ZMQ event plane (no NATS).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import uuid
from typing import Any, Literal

__all__ = ["DynamoSettings", "create_runtime"]

_env_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class DynamoSettings:
    """How engines and routers of one deployment find each other."""

    namespace: str = "relayrl"
    """Dynamo namespace: one per deployment (``relayrl run`` uses one per run)."""
    component: str = "engine"
    endpoint: str = "generate"
    discovery: Literal["file", "mem", "etcd"] = "file"
    discovery_dir: str = ""
    """``file`` discovery: the shared registration directory (empty: a fresh temporary one)."""
    etcd_endpoints: str = "http://127.0.0.1:2379"
    host: str = "127.0.0.1"
    """Address this process's TCP request plane advertises."""

    @property
    def path(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint}"

    def resolved(self) -> DynamoSettings:
        """With a fresh discovery directory when ``file`` discovery names none."""
        if self.discovery == "file" and not self.discovery_dir:
            return dataclasses.replace(self, discovery_dir=tempfile.mkdtemp(prefix="relayrl-dynamo-"))
        return self

    @classmethod
    def isolated(cls, discovery: Literal["file", "mem", "etcd"] = "file", **kwargs: Any) -> DynamoSettings:
        """Settings no other deployment shares: a unique namespace (tests, in-process routers)."""
        return cls(namespace=f"relayrl-{uuid.uuid4().hex[:12]}", discovery=discovery, **kwargs).resolved()


def create_runtime(loop: Any, settings: DynamoSettings) -> Any:
    """A ``DistributedRuntime`` on ``loop`` configured by ``settings``."""
    os.environ.setdefault("DYN_LOG", "warn")  # Dynamo logs every connection at info level
    from dynamo.runtime import DistributedRuntime

    settings = settings.resolved()
    variables = {"DYN_DISCOVERY_BACKEND": settings.discovery, "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq",
                 "DYN_TCP_RPC_HOST": settings.host}
    if settings.discovery == "file":
        variables["DYN_FILE_KV"] = settings.discovery_dir
    elif settings.discovery == "etcd":
        variables["ETCD_ENDPOINTS"] = settings.etcd_endpoints
    with _env_lock:  # the runtime reads its configuration from the environment when created
        os.environ.update(variables)
        return DistributedRuntime(loop, settings.discovery, "tcp", event_plane="zmq")
