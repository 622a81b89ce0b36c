"""Typed settings: one definition per setting, read by validation, JSON Schema, command-line
flags and the generated reference.

A settings type is a dataclass whose fields are declared with :func:`setting` (a default, a
one-line description, a unit, bounds, allowed values, the YAML key where it differs from the
field's name). :func:`parse` builds one from a parsed YAML mapping; every error names the key
path, the value, what was expected and, for an unknown key, the closest known one.
:func:`json_schema` describes it for editors and Helm values; :func:`rows` for the reference.

Plain dataclasses rather than pydantic: these types are also the runtime's (slotted, read on
hot paths, built directly by tests and other code), the errors follow Baton's one form
(``engines[1].role: expected ...``), and the handful of field types settings use need no
general-purpose validator."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from baton.core.errors import ConfigError, did_you_mean

_MISSING = dataclasses.MISSING


def setting(default: Any = _MISSING, *, doc: str, unit: str | None = None, gt: float | None = None,
            ge: float | None = None, le: float | None = None, choices: tuple[Any, ...] | None = None,
            key: str | None = None, check: Callable[[Any], str | None] | None = None, secret: bool = False,
            factory: Callable[[], Any] | None = None, internal: bool = False, flag: str | bool = False) -> Any:
    """A settings field: ``default`` (or ``factory``), a one-line ``doc``, its ``unit``,
    bounds (``gt``/``ge``/``le``), allowed ``choices``, the YAML ``key`` where it differs
    from the field's name, a ``check`` returning what is wrong with a value (or None),
    ``secret`` (never echoed), ``internal`` (derived by code, not read from YAML), and
    ``flag``: the command-line flag that sets it too (True: ``--`` and the key with dashes)."""
    meta = {"doc": doc, "unit": unit, "gt": gt, "ge": ge, "le": le, "choices": choices, "key": key,
            "check": check, "secret": secret, "internal": internal, "flag": flag}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One setting as the reference shows it: YAML key, field name, type, default, unit,
    bounds, allowed values and description."""

    key: str
    name: str
    kind: Any
    default: Any
    required: bool
    doc: str
    unit: str | None
    gt: float | None
    ge: float | None
    le: float | None
    choices: tuple[Any, ...] | None
    check: Callable[[Any], str | None] | None
    secret: bool
    flag: str | None

    @property
    def dest(self) -> str:
        """Where argparse keeps its flag's value (the flag's name, as argparse derives it)."""
        return self.flag[2:].replace("-", "_") if self.flag else self.key


@functools.cache
def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings of a settings type, in declaration order (internal fields left out;
    computed once per type: type hints are resolved by name)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "doc" not in meta or meta["internal"]:
            continue
        required = f.default is _MISSING and f.default_factory is _MISSING
        default = None if required else f.default if f.default is not _MISSING else f.default_factory()
        key = meta["key"] or f.name
        flag = meta["flag"] if isinstance(meta["flag"], str) else "--" + key.replace("_", "-") if meta["flag"] else None
        out.append(Setting(key, f.name, hints[f.name], default, required, meta["doc"], meta["unit"], meta["gt"],
                           meta["ge"], meta["le"], meta["choices"], meta["check"], meta["secret"], flag))
    return tuple(out)


def parse(cls: type, raw: Any, where: str, extra_keys: tuple[str, ...] = (),
          built: Mapping[str, Any] | None = None) -> Any:
    """A ``cls`` from the mapping ``raw`` (``where``: its key path, for errors). Keys in
    ``extra_keys`` are allowed and left for the caller; fields in ``built`` (by name) the
    caller has already read from ``raw``."""
    values = given(cls, raw, where, extra_keys, built)
    for s in settings_of(cls):
        if s.required and s.name not in values:
            raise ConfigError(f"{_join(where, s.key)}: required ({describe_kind(s.kind)}: {s.doc})")
    return cls(**values)


def given(cls: type, raw: Any, where: str, extra_keys: tuple[str, ...] = (),
          built: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings ``raw`` gives (by field name, checked), to lay over defaults or a base."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {_shown(raw)}")
    known = settings_of(cls)
    by_key = {s.key: s for s in known}
    for k in raw:
        if k not in by_key and k not in extra_keys:
            names = [*by_key, *extra_keys]
            hint = did_you_mean(str(k), names)
            listed = f"; known: {', '.join(sorted(names))}" if len(names) <= 24 else \
                "; `baton config schema` lists them"
            raise ConfigError(f"{_join(where, k)}: unknown key{hint or listed}")
    values = dict(built or {})
    for s in known:
        if s.name not in values and raw.get(s.key) is not None:
            values[s.name] = check_value(s, raw[s.key], _join(where, s.key))
    return values


def validate(obj: Any, where: str) -> None:
    """ConfigError naming the first field of the settings object ``obj`` (built by code or
    flags, not parsed) whose value is out of its bounds or choices."""
    for s in settings_of(type(obj)):
        value = getattr(obj, s.name)
        if value is not None and not dataclasses.is_dataclass(value):
            check_value(s, value, _join(where, s.key))


def check_value(s: Setting, value: Any, path: str) -> Any:
    """``value`` converted to ``s``'s type and checked against its bounds, choices and check."""
    value = convert(s.kind, value, path, s.secret)
    shown = "(hidden)" if s.secret else _shown(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for bound, ok, word in ((s.gt, lambda b: value > b, ">"), (s.ge, lambda b: value >= b, ">="),
                                (s.le, lambda b: value <= b, "<=")):
            if bound is not None and not ok(bound):
                raise ConfigError(f"{path}: expected a number {word} {bound:g}, got {shown}")
    if s.choices is not None and value not in s.choices:
        raise ConfigError(f"{path}: expected one of {', '.join(map(str, s.choices))}, got {shown}"
                          f"{did_you_mean(str(value), s.choices)}")
    problem = s.check(value) if s.check is not None else None
    if problem:
        raise ConfigError(f"{path}: {problem}")
    return value


def convert(kind: Any, value: Any, path: str, secret: bool = False) -> Any:
    """``value`` as a ``kind`` (a type hint); ConfigError names ``path`` otherwise."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(option, value, path, secret)
            except ConfigError:
                continue
    elif kind is Any:
        return value
    elif origin is typing.Literal:
        if value in args:
            return value
    elif origin in (tuple, list):
        if isinstance(value, (list, tuple)):
            item = args[0] if args else Any
            items = [convert(item, v, f"{path}[{i}]", secret) for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif origin is dict:
        if isinstance(value, Mapping):
            return {convert(args[0], k, path): convert(args[1], v, f"{path}.{k}", secret) for k, v in value.items()}
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            pass
    elif dataclasses.is_dataclass(kind):
        return parse(kind, value, path)
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(kind, type) and isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ConfigError(f"{path}: expected {describe_kind(kind)}, got {'(hidden)' if secret else _shown(value)}")


def describe_kind(kind: Any) -> str:
    """A type hint in words (``a positive integer`` is the bounds' job: this says ``an integer``)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_kind(a) for a in args if a is not type(None))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (tuple, list):
        return f"a list of {_plural(describe_kind(args[0]) if args else 'values')}"
    if origin is dict:
        return f"a mapping of {_plural(describe_kind(args[1]))}"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in kind)
    if dataclasses.is_dataclass(kind):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, "a value")


def _plural(words: str) -> str:
    for article in ("an ", "a "):
        if words.startswith(article):
            return words[len(article):] + "s"
    return words


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_schema(cls: type, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a settings type: its keys, their types, defaults,
    bounds, units and descriptions; unknown keys are not allowed."""
    props, required = {}, []
    for s in settings_of(cls):
        prop = _kind_schema(s.kind)
        prop["description"] = s.doc + (f" ({s.unit})" if s.unit else "")
        if not s.required and not s.secret and _jsonable(s.default):
            prop["default"] = s.default.value if isinstance(s.default, enum.Enum) else s.default
        for bound, word in ((s.gt, "exclusiveMinimum"), (s.ge, "minimum"), (s.le, "maximum")):
            if bound is not None:
                prop[word] = bound
        if s.choices is not None:
            prop["enum"] = list(s.choices)
        props[s.key] = prop
        if s.required:
            required.append(s.key)
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if title:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    if required:
        schema["required"] = required
    return schema


def _kind_schema(kind: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [_kind_schema(a) for a in args if a is not type(None)]
        if type(None) in args:
            options.append({"type": "null"})
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (tuple, list):
        return {"type": "array", "items": _kind_schema(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object", "additionalProperties": _kind_schema(args[1])}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"enum": [m.value for m in kind]}
    if dataclasses.is_dataclass(kind):
        return json_schema(kind)
    return {int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"},
            str: {"type": "string"}}.get(kind, {})


def _jsonable(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return value is None or isinstance(value, (str, int, float, bool))


def add_flags(parser: Any, cls: type, keys: tuple[str, ...] | None = None, suffix: str = "") -> None:
    """Add to the argparse ``parser`` the flags of ``cls``'s settings that have one (of
    ``keys`` only, when given), with the setting's description (plus ``suffix``) as help; an
    absent flag leaves its value None, so the config's or the base's value stands."""
    import argparse
    for s in settings_of(cls):
        if not s.flag or (keys is not None and s.key not in keys):
            continue
        if s.kind is bool:
            parser.add_argument(s.flag, dest=s.dest, action=argparse.BooleanOptionalAction, default=None,
                                help=f"{s.doc}{suffix} (default: {'on' if s.default else 'off'})".replace("%", "%%"))
            continue
        shown = s.default.value if isinstance(s.default, enum.Enum) else s.default
        default = "" if s.default is None or suffix else f" (default: {shown})"
        unit = f", {s.unit}" if s.unit and s.unit != "%" else ""
        parser.add_argument(s.flag, dest=s.dest, action=_checked(s), metavar=_metavar(s),
                            help=f"{s.doc}{suffix}{default}{unit}".replace("%", "%%"))


FLAG_ERRORS = "setting_flag_errors"  # where a namespace keeps what was wrong with its flags


def flag_errors(namespace: Any) -> None:
    """ConfigError for the first flag whose value its setting refused (``--port: expected a
    number <= 65535, got 70000``): one line, as for a config file, not argparse's usage."""
    errors = getattr(namespace, FLAG_ERRORS, None)
    if errors:
        raise ConfigError(errors[0])


def _checked(s: Setting) -> type:
    """An argparse action that converts and checks a flag's text as its setting says,
    keeping the error for :func:`flag_errors`."""
    import argparse

    class Checked(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            value: Any = values
            for kind in (int, float):
                if _admits(s.kind, kind):
                    try:
                        value = kind(values)
                        break
                    except ValueError:
                        continue
            try:
                setattr(namespace, self.dest, check_value(s, value, s.flag or s.key))
            except ConfigError as err:
                errors = getattr(namespace, FLAG_ERRORS, None) or []
                setattr(namespace, FLAG_ERRORS, [*errors, str(err)])
    return Checked


def _admits(kind: Any, simple: type) -> bool:
    args = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    return simple in args


def _metavar(s: Setting) -> str:
    kind = s.kind
    if s.choices:
        return "{" + ",".join(map(str, s.choices)) + "}"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "{" + ",".join(str(m.value) for m in kind) + "}"
    return "N" if _admits(kind, int) or _admits(kind, float) else "TEXT"
