"""Typed command configuration: YAML file, then CLI flags on top, into one frozen dataclass per command.

Unknown keys are an error rather than ignored, so a misspelt option in a scheduled job's YAML fails the
job at start instead of silently running with a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and the value."""


def _allowed_types(annotation: Any) -> tuple[type, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _allowed_types(arg))
    if annotation is type(None):
        return (type(None),)
    if annotation is float:
        return (float, int)
    origin = typing.get_origin(annotation)
    return (origin,) if origin else (annotation,)


def _item_types(annotation: Any) -> tuple[type, ...] | None:
    """The allowed types of each item of a ``tuple[X, ...]`` field; None for any other field."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _allowed_types(args[0])
    return None


def _section_type(annotation: Any) -> Any:
    """The config dataclass of an optional section (``Section | None``); other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        sections = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
        if len(sections) == 1 and type(None) in typing.get_args(annotation):
            return sections[0]
    return annotation


def _is_a(value: Any, allowed: tuple[type, ...]) -> bool:
    """isinstance, except that a YAML true/false is not accepted as a number."""
    return isinstance(value, allowed) and (not isinstance(value, bool) or bool in allowed)


def _names(allowed: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in allowed)


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> T:
    """Build ``cls`` from the YAML mapping at ``path`` (optional) with non-None ``overrides`` on top.

    A field whose type is itself a config dataclass (or one or None: an optional section) is read from a
    nested mapping, checked the same way; a field typed as a tuple accepts a YAML list.
    """
    data = read_config_file(path) if path is not None else {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    where = f"in {str(path)!r}" if path is not None else "in the overrides"
    return _build(cls, data, where=where, prefix="")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file at ``path``; ConfigError, in one line, if it cannot be read, parsed
    or is not a mapping. The command line calls it before any verb imports its libraries, so a broken
    file is reported at once rather than after seconds of TensorFlow or Beam start-up."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config file {str(path)!r}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_one_line(err)}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(
            f"config file {str(path)!r} should hold a mapping, but holds {type(loaded).__name__}"
        )
    return dict(loaded or {})


def _one_line(err: yaml.YAMLError) -> str:
    """PyYAML's message without its multi-line excerpt of the file: the problem and where it is."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{err.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(err).split())


def _build(cls: type[T], data: Mapping[str, Any], where: str, prefix: str) -> T:
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        unknown_keys = [prefix + k for k in unknown]
        raise ConfigError(f"unknown config keys {unknown_keys} {where}; known keys are {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        hint = _section_type(hints[key]) if value is not None else hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            if isinstance(value, hint):
                values[key] = value
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {prefix + key!r} should be a mapping, but is {value!r}")
            values[key] = _build(hint, value, where, prefix=f"{prefix}{key}.")
            continue
        if typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        allowed = _allowed_types(hint)
        if not _is_a(value, allowed):
            raise ConfigError(f"config key {prefix + key!r} should be {_names(allowed)}, but is {value!r}")
        items = _item_types(hint)
        if items and isinstance(value, tuple) and not all(_is_a(item, items) for item in value):
            # a layer size given as "wide" or 1.5 should fail here, not deep inside the model's build
            raise ConfigError(
                f"config key {prefix + key!r} should be a list of {_names(items)}, but is {list(value)!r}"
            )
        values[key] = value
    try:
        return cls(**values)
    except ValueError as err:
        raise ConfigError(f"{prefix.rstrip('.') + ': ' if prefix else ''}{err}") from None
