"""operator/specserving/data/capabilities.json is exactly what the probes on the real wheels say."""

from __future__ import annotations

import difflib
import json
from typing import Any

import pytest

from .conftest import gen

pytestmark = pytest.mark.decode_path


def test_committed_table_matches_the_wheels(reports: dict[str, Any]) -> None:
    regenerated = gen.render(gen.build_table(reports, gen.serving_facts_all()))
    committed = gen.TABLE.read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), regenerated.splitlines(True),
                                        "committed", "regenerated from the wheels"))
    assert not diff, f"capabilities.json is stale: run `python3 hack/gen-capabilities.py`\n{diff}"


def test_table_names_its_generator() -> None:
    table = json.loads(gen.TABLE.read_text())
    assert table["generatedBy"] == "hack/gen-capabilities.py"
    assert table["fixVersion"] == gen.fix_version()
    assert [row["sglang"] for row in table["versions"]] == gen.versions()
