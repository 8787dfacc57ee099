"""The relayrl plugin manager: one pluggy project, one entry-point group, typed registries.

Every relayrl package and every third-party plugin is a pluggy plugin of the project ``relayrl``,
found through the entry-point group ``relayrl``. Core packages add their own hookspecs through the
historic hook :func:`relayrl.core.hookspecs.relayrl_addhooks`, so a package's hooks exist exactly
when the package is installed.

Registration hooks (``relayrl_<area>_<noun>``) yield :class:`Registration` records; the typed
accessor :func:`registrations` gathers them into ``dict[name, Registration]`` and refuses a name
registered twice, naming both plugins.

Which plugins load is controlled by two environment variables, read when the manager is created:

``RELAYRL_LOAD_PLUGINS``
    Comma-separated allowlist of plugin (entry-point) names. Unset: every installed plugin loads.
    Set but empty: no third-party plugin loads.
``RELAYRL_DISABLE_PLUGINS``
    Comma-separated names never to load.

Both apply to third-party plugins only; the built-in plugins of relayrl's own packages (entry
points whose module lives under ``relayrl.``) always load, because other packages rely on the
hookspecs they add.

Example::

    from relayrl.core.plugins import get_plugin_manager, registrations

    pm = get_plugin_manager()
    stores = registrations(pm, "relayrl_core_stores")
    print(sorted(stores))            # ['file', 'memory', 's3', ...]
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as importlib_metadata
import inspect
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Generic, TypeVar

import pluggy

from relayrl.core.errors import PluginError

PROJECT = "relayrl"
"""The pluggy project name, and the entry-point group plugins are found under."""

ENTRY_POINT_GROUP = PROJECT

LOAD_ENV = "RELAYRL_LOAD_PLUGINS"
DISABLE_ENV = "RELAYRL_DISABLE_PLUGINS"

BUILTIN_MODULE_PREFIX = "relayrl."

hookspec = pluggy.HookspecMarker(PROJECT)
"""Marker for hook specifications (used by relayrl packages in their ``hookspecs`` modules)."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marker for hook implementations (used by every plugin)."""

PluginManager = pluggy.PluginManager
"""The type of every ``pm`` argument (:func:`create_plugin_manager` makes one); ``None`` there means
the process-wide :func:`get_plugin_manager`. Packages annotate with it instead of importing pluggy."""

F = TypeVar("F")
F_co = TypeVar("F_co", covariant=True)
"""A registration's factory type: covariant, so ``Kind[LossFactory]`` is a ``Kind[Callable[..., Loss]]``
and a generic builder's result has the type the factory Protocol returns."""
H = TypeVar("H", bound=Callable[..., Any])


def capabilities(**meanings: str) -> Callable[[H], H]:
    """Declare the capabilities a registration hook's records may claim, each with what it promises
    (``@capabilities(discovery="the factory also has serve_engine(...)")``, under ``@hookspec``).

    A kind's vocabulary is closed: :func:`registrations` refuses a record claiming a capability its
    hook does not declare (a misspelt ``"data_parallel"`` would otherwise just be ignored), so a
    typo fails when the plugin is loaded (``relayrl plugins``, ``relayrl config check``), not mid-run.
    """
    def mark(function: H) -> H:
        function.relayrl_capabilities = dict(meanings)  # type: ignore[attr-defined]
        return function

    return mark


def declared_capabilities(pm: pluggy.PluginManager | None, hook_name: str) -> dict[str, str]:
    """The capabilities records of ``hook_name`` may claim, with what each promises (empty: none)."""
    pm = get_plugin_manager() if pm is None else pm
    caller = getattr(pm.hook, hook_name, None)
    if caller is None or caller.spec is None:
        raise PluginError(f"{hook_name}: no such hook (is the package that defines it installed?)")
    return dict(getattr(caller.spec.function, "relayrl_capabilities", {}))


@dataclasses.dataclass(frozen=True)
class Registration(Generic[F_co]):
    """One named thing a plugin offers: a store backend, a loss, a sandbox backend, ...

    Registration hooks yield these. ``factory`` builds the thing (its signature is documented by
    the hookspec of each kind); ``plugin`` is filled in by :func:`registrations` with the name of
    the plugin that yielded the record.

    What the thing can do beyond its kind's contract is *declared* here, never probed:

    ``config``
        The struct (a :class:`relayrl.core.config.Section`) the user's options table for this name
        decodes into, with its own checks; :func:`relayrl.core.config.resolve_plugin` decodes it and
        the factory receives the result. None: the thing takes no options.
    ``capabilities``
        Names of optional abilities its kind defines: each hook declares its vocabulary with
        :func:`capabilities` (a trainer backend's ``data-parallel`` and ``elastic``, a router's
        ``discovery``, a task source's ``detects``), and a record claiming any other name is refused.
        A capability may promise more of the factory or product; a Protocol next to the hook states it
        (``DiscoveryRouterFactory``, ``DetectingTaskSourceFactory``).
    """

    name: str
    factory: F_co
    description: str = ""
    plugin: str = ""
    config: type | None = None
    capabilities: Collection[str] = frozenset()
    """Stored as a frozenset."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"registration name must be a non-empty string without spaces, got {self.name!r}")
        if not callable(self.factory):
            raise ValueError(f"registration {self.name!r}: factory must be callable, got {self.factory!r}")
        if self.config is not None and not isinstance(self.config, type):
            raise ValueError(f"registration {self.name!r}: config must be a struct type, got {self.config!r}")
        if isinstance(self.capabilities, str) or not all(isinstance(c, str) and c for c in self.capabilities):
            raise ValueError(f"registration {self.name!r}: capabilities must be a collection of names, "
                             f"got {self.capabilities!r}")
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """Where a loaded plugin came from."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    builtin: bool


class RelayrlPluginManager(pluggy.PluginManager):
    """A pluggy manager for project ``relayrl`` that remembers where each plugin came from."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.plugin_infos: dict[str, PluginInfo] = {}

    def register_plugin(self, plugin: object, info: PluginInfo) -> None:
        """Register ``plugin`` under ``info.name``; any failure becomes a one-line PluginError."""
        if info.name in self.plugin_infos or self.has_plugin(info.name):
            previous = self.plugin_infos.get(info.name)
            where = f" (already provided by {_describe_origin(previous)})" if previous else ""
            raise PluginError(f"plugin {info.name!r} from {_describe_origin(info)}: a plugin of that name is already loaded{where}")
        try:
            self.register(plugin, name=info.name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {info.name!r} from {_describe_origin(info)}: {_one_line(exc)}") from exc
        except Exception as exc:  # an addhooks implementation raised
            if self.has_plugin(info.name):
                self.unregister(name=info.name)
            raise PluginError(
                f"plugin {info.name!r} from {_describe_origin(info)}: failed while registering: {_one_line(exc)}"
            ) from exc
        self.plugin_infos[info.name] = info

    def check_unknown_hooks(self) -> None:
        """Raise PluginError naming the plugin and hook for any implementation without a spec.

        This is pluggy's ``check_pending`` with a message that names the plugin by its entry-point
        name, so that ``relayrl plugins`` can print it on one line.
        """
        for hook_name in sorted(vars(self.hook)):
            if not hook_name.startswith(PROJECT):
                continue
            caller = getattr(self.hook, hook_name)
            if caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: implements unknown hook {hook_name!r} "
                    f"(no installed relayrl package defines it; is a package missing or the name misspelt?)"
                )

    def load_entry_points(self, *, environ: Mapping[str, str] | None = None) -> None:
        """Load every plugin of the entry-point group ``relayrl`` that the environment allows."""
        environ = os.environ if environ is None else environ
        allow = _name_list(environ.get(LOAD_ENV)) if LOAD_ENV in environ else None
        deny = _name_list(environ.get(DISABLE_ENV, ""))
        for entry_point in _entry_points():
            dist = getattr(entry_point, "dist", None)
            info = PluginInfo(
                name=entry_point.name,
                module=entry_point.value,
                distribution=dist.name if dist is not None else None,
                version=dist.version if dist is not None else None,
                builtin=entry_point.value.startswith(BUILTIN_MODULE_PREFIX),
            )
            if not info.builtin and (info.name in deny or (allow is not None and info.name not in allow)):
                continue
            if info.name in self.plugin_infos and self.plugin_infos[info.name].module == info.module:
                continue  # the same distribution found twice on sys.path
            try:
                plugin = entry_point.load()
            except Exception as exc:
                raise PluginError(f"plugin {info.name!r} from {_describe_origin(info)}: import failed: {_one_line(exc)}") from exc
            self.register_plugin(plugin, info)

    def hooks_of(self, name: str) -> list[str]:
        """Names of the hooks that plugin ``name`` implements, sorted."""
        plugin = self.get_plugin(name)
        if plugin is None:
            return []
        return sorted(caller.name for caller in self.get_hookcallers(plugin) or [])


def _entry_points() -> list[importlib_metadata.EntryPoint]:
    eps = importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)
    # Built-ins first so that their hookspecs exist before third-party impls are verified; then by
    # name, so that load order (and therefore registry order) does not depend on sys.path order.
    return sorted(eps, key=lambda ep: (not ep.value.startswith(BUILTIN_MODULE_PREFIX), ep.name, ep.value))


def _name_list(value: str | None) -> set[str]:
    return {part.strip() for part in (value or "").split(",") if part.strip()}


def _describe_origin(info: PluginInfo | None) -> str:
    if info is None:
        return "?"
    if info.distribution:
        return f"{info.distribution} {info.version} ({info.module})"
    return info.module


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_manager: RelayrlPluginManager | None = None
_manager_lock = threading.Lock()


def create_plugin_manager(*, load_entry_points: bool = True, environ: Mapping[str, str] | None = None,
                          plugins: Iterable[tuple[str, object]] = ()) -> RelayrlPluginManager:
    """Build a fresh plugin manager: core hookspecs, installed plugins, then ``plugins`` given here.

    ``plugins`` is a sequence of ``(name, plugin_object)`` registered after the entry points; tests
    and embedding applications use it to add in-process plugins.
    Raises :class:`PluginError` (one line, naming the plugin) when any plugin is broken.
    """
    from relayrl.core import _builtin, hookspecs

    pm = RelayrlPluginManager()
    pm.add_hookspecs(hookspecs)
    pm.hook.relayrl_addhooks.call_historic(kwargs={"pluginmanager": pm})
    pm.register_plugin(_builtin, PluginInfo("relayrl-core", _builtin.__name__, *_dist_of("relayrl-core"), builtin=True))
    if load_entry_points:
        pm.load_entry_points(environ=environ)
    for name, plugin in plugins:
        pm.register_plugin(plugin, PluginInfo(name, getattr(plugin, "__name__", type(plugin).__name__), None, None, False))
    pm.check_unknown_hooks()
    return pm


def _dist_of(distribution: str) -> tuple[str | None, str | None]:
    try:
        return distribution, importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return None, None


def get_plugin_manager() -> RelayrlPluginManager:
    """The process-wide plugin manager, created on first use from the installed plugins."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = create_plugin_manager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager, so the next :func:`get_plugin_manager` rebuilds it."""
    global _manager
    with _manager_lock:
        _manager = None


def registrations(pm: pluggy.PluginManager | None, hook_name: str, **kwargs: Any) -> dict[str, Registration[Any]]:
    """Call registration hook ``hook_name`` and return its records by name, in plugin load order.

    Each record's ``plugin`` field names the plugin that yielded it. Two records of the same name
    raise :class:`PluginError` naming both plugins; anything that is not a :class:`Registration`
    raises PluginError naming the plugin that yielded it.
    """
    pm = get_plugin_manager() if pm is None else pm
    caller = getattr(pm.hook, hook_name, None)
    if caller is None or caller.spec is None:
        raise PluginError(f"{hook_name}: no such hook (is the package that defines it installed?)")
    result: dict[str, Registration[Any]] = {}
    allowed = getattr(caller.spec.function, "relayrl_capabilities", {})
    # get_hookimpls() is in registration order (pluggy *calls* them in reverse); registries keep
    # load order, so built-ins come first.
    for impl in caller.get_hookimpls():
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            produced = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            records = list(produced) if produced is not None else []
        except Exception as exc:
            raise PluginError(f"plugin {impl.plugin_name!r}: {hook_name} failed: {_one_line(exc)}") from exc
        for record in records:
            if not isinstance(record, Registration):
                raise PluginError(f"plugin {impl.plugin_name!r}: {hook_name} yielded {record!r}, expected a Registration")
            unknown = sorted(set(record.capabilities) - set(allowed))
            if unknown:
                raise PluginError(f"plugin {impl.plugin_name!r}: {hook_name} record {record.name!r} claims capabilities "
                                  f"{unknown} that the hook does not define (defined: {sorted(allowed) or 'none'})")
            if record.name in result:
                first = result[record.name].plugin
                raise PluginError(
                    f"{hook_name}: name {record.name!r} is registered by both plugin {first!r} and plugin {impl.plugin_name!r}"
                )
            result[record.name] = dataclasses.replace(record, plugin=impl.plugin_name)
    return result


def lookup(pm: pluggy.PluginManager | None, hook_name: str, name: str, *, kind: str, **kwargs: Any) -> Registration[Any]:
    """The registration called ``name`` of a kind, or a PluginError listing the names available."""
    table = registrations(pm, hook_name, **kwargs)
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none"
        raise PluginError(f"unknown {kind} {name!r} (available: {known})") from None


@dataclasses.dataclass(frozen=True)
class Kind(Generic[F_co]):
    """One registry, typed: its registration hook and what its things are called, with ``F`` the
    factory Protocol of the kind. Each package declares its kinds next to their hookspecs
    (``ENGINES: Kind[EngineFactory] = Kind("relayrl_rollout_engines", "engine")``), so a lookup through
    it gives a typed ``Registration[EngineFactory]`` and a builder's result is what the Protocol says::

        record = ENGINES.lookup(pm, "torch")      # Registration[EngineFactory]
    """

    hook: str
    """The registration hook (``relayrl_<area>_<noun>``)."""
    noun: str
    """What one of its things is called in messages (``unknown engine 'torh' (available: torch, vllm)``)."""

    def registrations(self, pm: pluggy.PluginManager | None = None) -> dict[str, Registration[F_co]]:
        """Every record of the kind by name (:func:`registrations`)."""
        return registrations(pm, self.hook)

    def lookup(self, pm: pluggy.PluginManager | None, name: str) -> Registration[F_co]:
        """The record called ``name``, or a PluginError listing the names available (:func:`lookup`)."""
        return lookup(pm, self.hook, name, kind=self.noun)


def describe_hookspecs(pm: pluggy.PluginManager) -> dict[str, str]:
    """Every hookspec the manager knows, mapped to its docstring (empty when undocumented)."""
    specs: dict[str, str] = {}
    for hook_name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, hook_name)
        if getattr(caller, "spec", None) is not None:
            specs[hook_name] = inspect.getdoc(caller.spec.function) or ""
    return specs

