"""Config files: TOML decoded into msgspec structs, with errors that name the dotted key.

A run config is a TOML file whose top-level tables are *sections*. Each installed package
contributes its sections through the ``relayrl_core_config_sections`` hook (core owns ``[run]``
and ``[store]``), so the same file is validated against every installed package::

    [run]
    name = "quickstart"
    seed = 1

    [trainer.optimizer]
    lr = 1e-4

Mistakes fail before anything starts, naming the key::

    trainer.optimizer.lrr: unknown key; did you mean lr?
    run.seed: expected int, got str

``--set a.b.c=value`` overrides are applied before validation; the value is parsed as a TOML value
(``3``, ``1e-4``, ``true``, ``"text"``, ``[1, 2]``), and anything that does not parse is a string.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

from relayrl.core.errors import ConfigError, PluginError
from relayrl.core.plugins import F, Kind, PluginManager, Registration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

S = TypeVar("S", bound=msgspec.Struct)


class Section(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Base class of config sections: keyword-only, immutable, unknown keys rejected.

    A subclass inherits all three; the modules under strict mypy restate ``frozen=True`` (``class
    RunSection(Section, frozen=True)``), since mypy's reading of msgspec's dataclass transform takes a
    subclass that does not say so for a mutable one.

    A section whose values name plugins (``loss = "ppo-clip"``) overrides :meth:`check` to resolve
    those names against the plugin registries and validate their options, so that a bad name fails
    at ``relayrl config check`` rather than minutes into a run.
    """

    def check(self, pm: PluginManager | None, path: str) -> None:
        """Validate what plain decoding cannot (plugin names, cross-field rules); raise ConfigError."""

    def check_with(self, config: Config, pm: PluginManager | None, path: str) -> None:
        """Validate rules that span sections, once every section is decoded; raise ConfigError.

        ``config`` holds every section (defaults included). A plugin's section states here what it
        needs of the others (``[deepspeed] bf16`` needs ``model.dtype = "bfloat16"``), so the rule
        lives with the plugin and ``relayrl config check`` reports it.
        """


class RunSection(Section, frozen=True):
    """``[run]``: identity and reproducibility of a run."""

    name: str = "relayrl-run"
    """Run name; the default run directory is ``runs/<name>``."""
    seed: int = 0
    """Seed for every random generator in every process of the run."""
    deterministic: bool = False
    """Bitwise-reproducible training (slower kernels); see ``relayrl.algo.determinism``."""
    lease_ttl_s: float = 60.0
    """One launcher per run: a launcher on another host whose lease heartbeat is older than this is
    taken for dead (one on this host is checked directly); the heartbeat runs every ``lease_ttl_s / 6``."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        if not self.lease_ttl_s > 0 or self.lease_ttl_s == float("inf"):
            raise ConfigError(f"{path}.lease_ttl_s: must be a finite number of seconds > 0, got {self.lease_ttl_s}")
        # The default run directory is runs/<name>: a name that is empty or walks out of runs/ is refused.
        if not self.name.strip() or self.name in (".", "..") or any(sep in self.name for sep in ("/", "\\")):
            raise ConfigError(f"{path}.name: {self.name!r} is not a plain directory name (no '/', not '..' or empty)")


class StoreSection(Section, frozen=True):
    """``[store]``: the object store that serves as the bus."""

    url: str = ""
    """fsspec URL of the bus (``s3://bucket/run``); empty means the run directory itself."""
    options: dict[str, Any] = {}
    """Options of the store backend of the URL's scheme, as its registration declares them
    (``endpoint_url`` for ``s3``, ``fsync`` for a directory): a key it does not declare is an error.
    A scheme no plugin registers (``gs://`` through fsspec) passes them to fsspec's filesystem unchecked."""

    def check(self, pm: PluginManager | None, path: str) -> None:
        # Checked here, not when a process first opens it (then contacting whatever host the URL names).
        import fsspec

        from relayrl.core.hookspecs import STORES
        from relayrl.core.store import url_scheme

        scheme = url_scheme(self.url) if self.url else "file"  # empty: the run directory
        backends = STORES.registrations(pm)
        if scheme in backends:
            resolve_plugin(pm, STORES, scheme, self.options, path=f"{path}.url", options_path=f"{path}.options")
        if not self.url:
            return
        if scheme == "memory":
            raise ConfigError(f"{path}.url: {self.url!r} lives inside one process, and a run's processes share "
                              f"the bus: use a directory (the default: the run directory) or s3://")
        if scheme not in backends and scheme not in fsspec.available_protocols():
            raise ConfigError(f"{path}.url: no store handles scheme {scheme!r} of {self.url!r} "
                              f"(registered: {', '.join(sorted(backends))}; is a plugin missing?)")


class Config:
    """A validated run config: one decoded struct per section, plus the raw data it came from.

    ``config.run`` / ``config["run"]`` return the section struct; sections absent from the file
    hold their defaults.
    """

    def __init__(self, sections: Mapping[str, msgspec.Struct], source: str, raw: Mapping[str, Any]) -> None:
        self.sections = dict(sections)
        self.source = source
        self.raw = dict(raw)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.sections[name]
        except KeyError:
            raise ConfigError(f"{name}: no such config section (known: {', '.join(sorted(self.sections))})") from None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("sections", "source", "raw"):
            raise AttributeError(name)
        try:
            return self[name]
        except ConfigError as exc:  # keep hasattr() and friends working
            raise AttributeError(str(exc)) from None

    def to_builtins(self) -> dict[str, Any]:
        """Every section, defaults included, as plain dicts (for logging and ``run.toml``)."""
        return {name: msgspec.to_builtins(value) for name, value in sorted(self.sections.items())}


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into ``(["a", "b", "c"], parsed_value)``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.split("."), parsed


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a TOML dict in place and return it."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: {'.'.join(path[:depth + 1])} is a value, not a table")
            node = child
        node[path[-1]] = value
    return data


def convert(data: Any, type_: type[S], *, path: str = "") -> S:
    """Decode plain data into ``type_``; errors name the dotted path below ``path``."""
    _check_unknown_keys(data, mi.type_info(type_), path)
    try:
        return msgspec.convert(data, type_, strict=True)
    except msgspec.ValidationError as exc:
        message = _format_validation_error(str(exc), path)
        allowed = _literal_values_at(mi.type_info(type_), str(exc))
        if allowed:
            message += f" (expected one of: {', '.join(map(str, allowed))})"
        raise ConfigError(message) from None


def resolve_plugin(pm: PluginManager | None, kind: Kind[F], name: str, options: Mapping[str, Any] | None, *,
                   path: str, options_path: str | None = None) -> tuple[Registration[F], Any]:
    """Look plugin ``name`` up in a registry and decode its options: ``(registration, config)``.

    ``config`` is ``options`` decoded into the registration's declared ``config`` struct and checked
    by its own rules (None when the registration declares none; options are then refused). Every
    error is one :class:`ConfigError` naming the key: ``path`` (the key naming the plugin, e.g.
    ``algo.loss``) for an unknown name, ``options_path`` (default ``<path>_options``) and the dotted
    option below it for bad options (``algo.loss_options.clip_hihg: unknown key``). The caller builds
    the thing with the registration's factory, in the shape its kind's Protocol documents.
    """
    options_path = options_path or f"{path}_options"
    try:
        record = kind.lookup(pm, name)
    except PluginError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if record.config is None:
        if options:
            raise ConfigError(f"{options_path}: {kind.noun} {name!r} takes no options (its registration declares no config)")
        return record, None
    config: Any = convert(dict(options or {}), record.config, path=options_path)
    if isinstance(config, Section):  # its own rules (ranges, names), as core checks a run's sections
        config.check(pm, options_path)
    return record, config


def resolve_plugin_keywords(pm: PluginManager | None, kind: Kind[F], name: str, options: Mapping[str, Any] | None,
                            *, path: str, options_path: str | None = None) -> tuple[Registration[F], dict[str, Any]]:
    """:func:`resolve_plugin` for the kinds whose factories take their options as keywords (stores,
    engines, routers): ``(registration, keywords)``.

    The registration's ``config`` struct *declares* the options (names, types, its own checks), so a
    misspelt or ill-typed key is a :class:`ConfigError` naming it (``rollout.engine_options.share_prefil:
    unknown key; did you mean share_prefill?``). ``keywords`` holds only the keys the user set, decoded
    into their declared types: the factory's own defaults apply to the rest.
    """
    record, config = resolve_plugin(pm, kind, name, options, path=path, options_path=options_path)
    keywords = {} if config is None else {key: getattr(config, key) for key in (options or {})}
    return record, keywords


def load_config(source: str | Path | Mapping[str, Any], *, overrides: Iterable[str] = (), pm: PluginManager | None = None) -> Config:
    """Read and validate a run config from a TOML file (or an already-parsed mapping).

    Every top-level table must be a section some installed package registers; each is decoded
    into its struct. Raises :class:`ConfigError` whose message starts with the file and dotted key.
    """
    if isinstance(source, Mapping):
        origin, data = "<config>", _deep_copy(source)
    else:
        origin = str(source)
        try:
            with open(source, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"{origin}: no such config file") from None
        except IsADirectoryError:
            raise ConfigError(f"{origin}: is a directory, not a TOML config file") from None
        except PermissionError:
            raise ConfigError(f"{origin}: not readable (permission denied)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    overrides = list(overrides)
    from_file = _deep_copy(data) if overrides else data
    apply_overrides(data, overrides)

    def blamed(message: str) -> ConfigError:
        # An invalid value that came from --set is the override's fault, not the file's.
        return ConfigError(f"{_origin_of(message, origin, overrides, from_file)}: {message}")

    from relayrl.core.hookspecs import CONFIG_SECTIONS

    section_types = {name: record.factory for name, record in CONFIG_SECTIONS.registrations(pm).items()}
    sections: dict[str, msgspec.Struct] = {}
    for name, value in data.items():
        if name not in section_types:
            raise blamed(f"{name}: unknown key{_suggestion(name, section_types)}")
        if not isinstance(value, dict):
            raise blamed(f"{name}: expected a table, got {_kind(value)}")
    for name, section_type in section_types.items():
        try:
            section: msgspec.Struct = convert(data.get(name, {}), section_type, path=name)
            sections[name] = section
            if isinstance(section, Section):
                section.check(pm, name)  # first: a section's own rule says more ("> 0")
                _refuse_non_finite(section, name)
        except ConfigError as exc:
            raise blamed(str(exc)) from None
    config = Config(sections, origin, data)
    for name, section in sections.items():
        try:
            if isinstance(section, Section):
                section.check_with(config, pm, name)
        except ConfigError as exc:
            raise blamed(str(exc)) from None
    return config


# --------------------------------------------------------------------------------- internals
def _refuse_non_finite(value: Any, path: str) -> None:
    """Every number of a section (its fields, nested sections, tables and lists) finite: an infinite or
    NaN coefficient, rate or bound would poison the weights or wait forever, and no option means it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value}")
    if isinstance(value, msgspec.Struct):
        for field in msgspec.structs.fields(value):
            _refuse_non_finite(getattr(value, field.name), f"{path}.{field.name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _refuse_non_finite(item, f"{path}[{index}]")


def _origin_of(message: str, origin: str, overrides: list[str], from_file: Mapping[str, Any]) -> str:
    """``--set KEY=VALUE`` when the message's dotted key is (inside) an overridden key, or a key only
    an override introduced; else ``origin`` (the file)."""
    key = message.split(": ", 1)[0].strip()
    for item in reversed(overrides):  # the last override of a key is the one that counts
        name = item.split("=", 1)[0].strip()
        if key == name or key.startswith((name + ".", name + "[")):
            return f"--set {item}"
        if name.startswith(key + ".") and not _has_key(from_file, key):
            return f"--set {item}"
    return origin


def _has_key(data: Mapping[str, Any], dotted: str) -> bool:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _check_unknown_keys(value: Any, info: mi.Type, path: str) -> None:
    if isinstance(info, mi.StructType):
        if not isinstance(value, dict):
            return  # msgspec reports the type error with the path
        fields = {field.encode_name: field for field in info.fields}
        for key, item in value.items():
            if key not in fields:
                raise ConfigError(f"{_join(path, key)}: unknown key{_suggestion(key, fields)}")
            _check_unknown_keys(item, fields[key].type, _join(path, key))
    elif isinstance(info, mi.DictType) and isinstance(value, dict):
        for key, item in value.items():
            _check_unknown_keys(item, info.value_type, _join(path, str(key)))
    elif isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)) and isinstance(value, list):
        for index, item in enumerate(value):
            _check_unknown_keys(item, info.item_type, f"{path}[{index}]")
    elif isinstance(info, mi.UnionType) and isinstance(value, dict):
        structs = [member for member in info.types if isinstance(member, mi.StructType)]
        if len(structs) == 1:
            _check_unknown_keys(value, structs[0], path)


_MSGSPEC_ERROR = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<where>[^`]*)`)?$", re.DOTALL)


def _format_validation_error(text: str, prefix: str) -> str:
    match = _MSGSPEC_ERROR.match(text)
    message, where = (match.group("message"), match.group("where") or "") if match else (text, "")
    dotted = where.replace("[...]", ".*").lstrip(".")
    path = _join(prefix, dotted) if dotted else (prefix or "<root>")
    message = message.replace("`", "")
    return f"{path}: {message[:1].lower()}{message[1:]}"


def _literal_values_at(info: mi.Type, error: str) -> tuple[object, ...]:
    """The allowed values of the Literal field an "Invalid enum value" error points at, if any."""
    match = _MSGSPEC_ERROR.match(error)
    if not match or not match.group("where") or "enum value" not in error:
        return ()
    for part in re.findall(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]", match.group("where")):
        key = part[0]
        if isinstance(info, mi.UnionType):
            structs = [member for member in info.types if isinstance(member, mi.StructType)]
            info = structs[0] if len(structs) == 1 else info
        if key and isinstance(info, mi.StructType):
            fields = {field.encode_name: field.type for field in info.fields}
            if key not in fields:
                return ()
            info = fields[key]
        elif not key and isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
            info = info.item_type
        elif isinstance(info, mi.DictType):
            info = info.value_type
        else:
            return ()
    return tuple(info.values) if isinstance(info, mi.LiteralType) else ()


def _suggestion(key: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f" (known: {', '.join(sorted(candidates)) or 'none'})"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "array"}.get(type(value), type(value).__name__)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value
