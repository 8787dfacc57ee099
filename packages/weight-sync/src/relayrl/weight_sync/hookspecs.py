"""Hook specifications owned by relayrl-weight-sync (documented in ``docs/plugins.md``).

Storage backends are relayrl-core's ``relayrl_core_stores``; this package adds only codecs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import hookspec

if TYPE_CHECKING:
    from relayrl.core.plugins import Registration
    from relayrl.weight_sync.codecs import Codec


class CodecFactory(Protocol):
    """Builds a :class:`~relayrl.weight_sync.codecs.Codec` (it may ignore options it has no use for)."""

    def __call__(self, **options: Any) -> Codec: ...


@hookspec
def relayrl_weight_sync_codecs() -> Iterable[Registration[CodecFactory]]:
    """Tensor codecs for weight versions, one :class:`Registration` per codec name.

    ``name`` is what manifests record in ``TensorEntry.codec`` and what ``[weight_sync]
    delta_codec`` / ``full_codec`` select; ``factory(level=..., chunk_bytes=..., min_gain=...)``
    returns an object with ``name``, ``is_delta`` and ``encode_many`` / ``decode_many`` as
    :class:`relayrl.weight_sync.codecs.Codec` documents (it may ignore options it has no use for).
    Decoding must rebuild the exact bits and return their checksum
    (:func:`relayrl.weight_sync.checksum.tensor_checksum`). Built in: ``raw``, ``zstd``,
    ``planes-zstd``, ``xor-zstd``, ``xor-planes-zstd``, ``xor-sparse-zstd``. Example::

        @hookimpl
        def relayrl_weight_sync_codecs():
            yield Registration("xor-lz4", Lz4XorCodec, "XOR delta, lz4 frames")
    """
