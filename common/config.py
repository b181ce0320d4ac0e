"""Typed daemon configuration: defaults, then a TOML file, then environment variables, then flags."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from common.errors import ConfigError

# A TOML table (or a JSON object) as tomllib or a decoder reads it, before its reader checks it key by key and names
# the key that is wrong: open until then.
TomlTable = Mapping[str, Any]

T = TypeVar("T", bound=msgspec.Struct)


def load_config(
    cls: type[T],
    *,
    path: Path | None = None,
    env_prefix: str,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from its defaults, ``path`` (TOML), ``<env_prefix><FIELD>`` variables and ``overrides``.

    ``None`` values in ``overrides`` mean "flag not given" and are ignored.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_toml(path))
    infos = {f.name: f for f in msgspec.structs.fields(cls)}
    fields = set(infos)
    for key in values:
        if key not in fields:
            raise ConfigError(f"{path}: unknown setting {key!r}; known settings: {', '.join(sorted(fields))}")
    env = os.environ if env is None else env
    for name in fields:
        raw = env.get(f"{env_prefix}{name.upper()}")
        if raw is not None:
            # A list setting (egress_allow, image_registries_allowed, ...) is written comma-separated in a variable.
            listed = infos[name].default_factory is list
            values[name] = [item.strip() for item in raw.split(",") if item.strip()] if listed else raw
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
    try:
        config = msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    _refuse_non_finite(config)
    return config


def _refuse_non_finite(config: msgspec.Struct) -> None:
    """TOML and the environment can spell ``nan`` and ``inf``; no setting means either (a NaN timeout never expires)."""
    for field in msgspec.structs.fields(config):
        value = getattr(config, field.name)
        items = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(item, float) and not math.isfinite(item) for item in items):
            raise ConfigError(f"invalid configuration: {field.name} must be a finite number, not {value!r}")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
