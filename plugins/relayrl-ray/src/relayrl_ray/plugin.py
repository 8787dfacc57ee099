"""The relayrl-ray plugin: registers the ``ray`` launcher (kept cheap to import: Ray loads on use)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl
from relayrl_ray.config import RayLauncherOptions

if TYPE_CHECKING:
    from relayrl.cli.hookspecs import LauncherBackend, LauncherFactory


def _create(*, options: RayLauncherOptions | None = None, world: int = 1, run_dir: Path | None = None
            ) -> LauncherBackend:
    from relayrl_ray.backend import RayBackend  # imports Ray: only when a run asks for this launcher

    return RayBackend.create(options=options, world=world, run_dir=run_dir)


@hookimpl
def relayrl_cli_launchers() -> Iterator[Registration[LauncherFactory]]:
    yield Registration("ray", _create, "every process in a Ray actor, placed by resources on a Ray cluster",
                       config=RayLauncherOptions)
