"""Plain-dict SpecServing builders for tests: start from the seed example and adjust."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SEED_EXAMPLE = EXAMPLES / "dspark-pd-tp8dp8.yaml"


def example(name: str = "dspark-pd-tp8dp8") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def seed(**changes: Any) -> dict[str, Any]:
    """The seed example with dotted-path changes applied: seed(**{"spec.engine.dp": 3})."""
    obj = copy.deepcopy(example())
    for path, value in changes.items():
        set_path(obj, path, value)
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = obj
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value


DELETE = object()
