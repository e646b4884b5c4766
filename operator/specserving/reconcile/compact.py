"""JSON kept packed in memory: compact JSON through zlib, for what the operator holds per SpecServing between
passes and reads only now and then (renderings, watch bodies not yet compared, the owner index entry)."""

from __future__ import annotations

import json
import zlib
from typing import Any


def pack(value: Any) -> bytes:
    """Level 1: these are packed on every watch event, and level 1 already takes them to about a tenth."""
    return zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 1)


def unpack(raw: bytes) -> dict[str, Any]:
    """A fresh decoded copy: callers may change it."""
    decoded: dict[str, Any] = json.loads(zlib.decompress(raw))
    return decoded
