"""The plugin module named by the ``relayrl`` entry point: hook implementations only.

Keep this module cheap to import (``relayrl plugins`` imports every plugin): import heavy
dependencies inside the hooks, not at the top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayrl.core.plugins import Registration, hookimpl

if TYPE_CHECKING:
    from relayrl.weight_sync.hookspecs import CodecFactory

NAME = "relayrl-template"


@hookimpl
def relayrl_weight_sync_codecs() -> Iterator[Registration[CodecFactory]]:
    """Register the codec, so ``[weight_sync] full_codec = "relayrl-template"`` selects it."""
    from relayrl_template.codec import ZlibCodec

    yield Registration(NAME, ZlibCodec, "full tensors, zlib (template plugin)")
