"""Hook specifications owned by relayrl-weight-sync (documented in ``docs/plugins.md``).

Storage backends are relayrl-core's ``relayrl_core_stores``; this package adds only codecs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from relayrl.core.plugins import Kind, hookspec

if TYPE_CHECKING:
    from relayrl.core.plugins import Registration
    from relayrl.weight_sync.codecs import Codec


class CodecFactory(Protocol):
    """Builds a :class:`~relayrl.weight_sync.codecs.Codec`. Its options are these three, from
    ``[weight_sync]`` (``zstd_level``, ``chunk_mib``, ``min_gain``), and no others; a codec may
    ignore those it has no use for. A decoding controller builds it with none."""

    def __call__(self, *, level: int = ..., chunk_bytes: int = ..., min_gain: float = ...) -> Codec: ...


# The kinds this package defines, typed by their factory Protocol (relayrl.core.plugins.Kind).
CODECS: Kind[CodecFactory] = Kind("relayrl_weight_sync_codecs", "codec")


@hookspec
def relayrl_weight_sync_codecs() -> Iterable[Registration[CodecFactory]]:
    """Tensor codecs for weight versions, one :class:`Registration` per codec name.

    ``name`` is what manifests record in ``TensorEntry.codec`` and what ``[weight_sync]
    delta_codec`` / ``full_codec`` select; the factory is a :class:`CodecFactory` and returns an
    object with ``name``, ``is_delta`` and ``encode_many`` / ``decode_many`` as
    :class:`relayrl.weight_sync.codecs.Codec` documents.
    Decoding must rebuild the exact bits and return their checksum
    (:func:`relayrl.weight_sync.checksum.tensor_checksum`). Built in: ``raw``, ``zstd``,
    ``planes-zstd``, ``xor-zstd``, ``xor-planes-zstd``, ``xor-sparse-zstd``. Example::

        @hookimpl
        def relayrl_weight_sync_codecs():
            yield Registration("xor-lz4", Lz4XorCodec, "XOR delta, lz4 frames")
    """
