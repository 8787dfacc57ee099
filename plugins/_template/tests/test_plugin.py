"""The template plugin passes relayrl's shared store conformance suite, and is discoverable."""

from __future__ import annotations

import uuid

import pytest

from relayrl.core.hookspecs import STORES
from relayrl.core.plugins import create_plugin_manager
from relayrl.core.store import open_store
from relayrl.core.testing import StoreTests
from relayrl_template.plugin import SCHEME
from relayrl_template.store import DictStore


class TestDictStore(StoreTests):
    large_object_bytes = 8 * 1024 * 1024

    @pytest.fixture
    def store(self):
        return open_store(f"{SCHEME}://tests/{uuid.uuid4().hex}")


def test_registered_through_the_entry_point():
    pm = create_plugin_manager()
    record = STORES.registrations(pm)[SCHEME]
    assert record.plugin == "relayrl-template"
    assert isinstance(record.factory(f"{SCHEME}://x"), DictStore)
