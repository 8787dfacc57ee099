"""The template codec passes relayrl's codec conformance suite, and ``make_codec`` finds it."""

from __future__ import annotations

import pytest

from relayrl.weight_sync.codecs import make_codec
from relayrl.weight_sync.testing import CodecTests
from relayrl_template.codec import ZlibCodec
from relayrl_template.plugin import NAME


class TestZlibCodec(CodecTests):
    @pytest.fixture
    def codec(self):
        return ZlibCodec()


def test_registered_through_the_entry_point():
    assert isinstance(make_codec(NAME, level=3, chunk_bytes=1 << 20), ZlibCodec)
