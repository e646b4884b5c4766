"""Golden files: every example and every case directory renders exactly to its expected.yaml.

Set SPECSERVING_UPDATE_GOLDEN=1 to rewrite the expected files, then review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserving.api.loading import spec_of
from specserving.rendering import render

from .builders import EXAMPLES

CASES = Path(__file__).parent / "rendering" / "cases"
OWNER = {"namespace": "serving", "uid": "00000000-0000-4000-8000-000000000001"}
UPDATE = os.environ.get("SPECSERVING_UPDATE_GOLDEN") == "1"


def _cases() -> list[tuple[str, dict[str, Any], Path]]:
    out = []
    for example in sorted(EXAMPLES.glob("*.yaml")):
        obj = yaml.safe_load(example.read_text())
        obj["metadata"].update(OWNER)
        out.append((f"example-{example.stem}", obj, CASES / f"example-{example.stem}" / "expected.yaml"))
    for case in sorted(p for p in CASES.iterdir() if (p / "input.yaml").exists()):
        out.append((case.name, yaml.safe_load((case / "input.yaml").read_text()), case / "expected.yaml"))
    return out


@pytest.mark.parametrize(("slug", "obj", "expected"), _cases(), ids=[c[0] for c in _cases()])
def test_render_matches_golden(slug: str, obj: dict[str, Any], expected: Path) -> None:
    rendered = yaml.safe_dump_all(render(spec_of(obj), obj["metadata"]), sort_keys=True, width=120)
    if UPDATE:
        expected.parent.mkdir(parents=True, exist_ok=True)
        expected.write_text(rendered)
    assert expected.exists(), f"no golden file for {slug}: run with SPECSERVING_UPDATE_GOLDEN=1"
    assert rendered == expected.read_text()


def test_render_is_deterministic() -> None:
    for _, obj, _ in _cases():
        assert render(spec_of(obj), obj["metadata"]) == render(spec_of(obj), obj["metadata"])
