"""Hook specifications owned by relayrl-core.

Every hookspec of every relayrl package is documented in ``docs/plugins.md``; a test fails when one
is not. Registration hooks return (or yield) :class:`relayrl.core.plugins.Registration` records and
are called at start-up, never per token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from relayrl.core.plugins import Kind, hookspec

if TYPE_CHECKING:
    from relayrl.core.config import Section
    from relayrl.core.plugins import Registration, RelayrlPluginManager
    from relayrl.core.store import Store


class StoreFactory(Protocol):
    """Opens a :class:`~relayrl.core.store.Store` rooted at ``url``; ``options`` are the keys of
    ``[store.options]`` the user set, declared by the registration's ``config`` struct (keyword
    arguments of the factory's own: the signature says ``*args, **options`` only so that a factory
    may name exactly the options it takes)."""

    def __call__(self, url: str, /, *args: Any, **options: Any) -> Store: ...


STORES: Kind[StoreFactory] = Kind("relayrl_core_stores", "store")
CONFIG_SECTIONS: Kind[type[Section]] = Kind("relayrl_core_config_sections", "config section")


@hookspec(historic=True)
def relayrl_addhooks(pluginmanager: RelayrlPluginManager) -> None:
    """Add a package's own hookspecs to the plugin manager.

    Historic: a package registered after the call still receives it. Each relayrl package
    implements it once, in its built-in plugin::

        @hookimpl
        def relayrl_addhooks(pluginmanager):
            from relayrl.algo import hookspecs
            pluginmanager.add_hookspecs(hookspecs)
    """


@hookspec
def relayrl_core_stores() -> Iterable[Registration[StoreFactory]]:
    """Object-store backends, one :class:`Registration` per URL scheme.

    ``name`` is the URL scheme (``file``, ``memory``, ``s3`` ...). ``factory(url, **options)``
    returns a :class:`relayrl.core.store.Store` rooted at ``url``; ``options`` come from the config's
    ``[store.options]`` table. A backend passes ``relayrl.core.testing.StoreTests``. Example::

        @hookimpl
        def relayrl_core_stores():
            yield Registration("dict", DictStore.from_url, "in-process dict store")
    """


@hookspec
def relayrl_core_config_sections() -> Iterable[Registration[type[Section]]]:
    """Top-level sections of a run config, one :class:`Registration` per ``[section]``.

    ``name`` is the TOML table name; ``factory`` is the ``msgspec.Struct`` type the table decodes
    into (every field with a default, so an absent section means "defaults"). Packages contribute
    their own sections (``trainer``, ``buffer`` ...), so ``relayrl config check`` validates a file
    against every installed package. Example::

        @hookimpl
        def relayrl_core_config_sections():
            yield Registration("buffer", BufferConfig, "rollout buffer and staleness policy")
    """
