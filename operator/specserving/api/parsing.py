"""Turn a defaulted, schema-valid raw spec into the typed dataclasses, and typed values back into plain data."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, TypeVar

from specserving.api.fields import json_name
from specserving.api.schema import _unwrap_optional

T = TypeVar("T")


def _convert(tp: Any, value: Any) -> Any:
    tp = _unwrap_optional(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)  # type: ignore[arg-type]
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return [_convert(item, v) for v in value]
    return value


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(attribute, JSON name, type) of each field of a dataclass, resolved once per class: get_type_hints
    compiles every string annotation again on each call, which made parsing most of a webhook review's time."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, json_name(f), hints[f.name]) for f in dataclasses.fields(cls))


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build `cls` from its JSON form; absent optional fields take the dataclass defaults."""
    kwargs = {}
    for attr, name, tp in _fields(typing.cast(type, cls)):
        if name in data:
            kwargs[attr] = _convert(tp, data[name])
    return cls(**kwargs)


def to_plain(value: Any) -> Any:
    """The JSON form of an API value, leaving out unset optional fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is not None:
                out[json_name(f)] = to_plain(v)
        return out
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value
