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


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> T:
    """Build ``cls`` from the YAML mapping at ``path`` (optional) with non-None ``overrides`` on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"cannot read config file {str(path)!r}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(path)!r} should hold a mapping, but holds {type(loaded).__name__}"
            )
        data = {str(k).replace("-", "_"): v for k, v in (loaded or {}).items()}
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown config keys {unknown} in {str(path)!r}; known keys are {sorted(known)}")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key, value in data.items():
        allowed = _allowed_types(hints[key])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            names = " or ".join(t.__name__ for t in allowed)
            raise ConfigError(f"config key {key!r} should be {names}, but is {value!r}")
    try:
        return cls(**data)
    except ValueError as err:
        raise ConfigError(str(err)) from None
