"""Packed JSON: what goes in comes back, and siblings pack against their family's first text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from specserving.reconcile import compact
from specserving.reconcile.compact import NO_DICTIONARY, pack, unpack
from specserving.reconcile.packed import Rendering
from specserving.reconcile.plan import make_plan

from tests.unit.builders import seed


@pytest.fixture(autouse=True)
def fresh_families(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no family known, as a new process does."""
    monkeypatch.setattr(compact, "_dictionaries", {})
    yield


def deployment(owner: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"{owner}-decode", "namespace": "ns", "uid": f"uid-{owner}",
                         "labels": {"specserving.io/instance": owner, "specserving.io/role": "decode"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "engine", "image": "lmsysorg/sglang:v0.5.5", "args": [f"--arg-{i}" for i in range(80)]}]}}}}


def test_a_sibling_packs_to_its_differences_and_comes_back_whole() -> None:
    first, first_dictionary = pack(deployment("a"), "decode")
    second, second_dictionary = pack(deployment("b"), "decode")
    alone, no_dictionary = pack(deployment("b"))
    assert second_dictionary is first_dictionary  # one dictionary per family, shared
    assert no_dictionary == NO_DICTIONARY
    assert unpack(first, first_dictionary) == deployment("a")
    assert unpack(second, second_dictionary) == deployment("b")
    assert unpack(alone) == deployment("b")
    assert len(second) * 4 < len(alone)


def test_a_family_keeps_its_first_dictionary_whatever_comes_later() -> None:
    raw, dictionary = pack(deployment("a"), "decode")
    for owner in "bcdef":
        pack({"other": owner * 500}, "decode")
    assert unpack(raw, dictionary) == deployment("a")


def test_past_the_cap_a_new_family_packs_without_a_dictionary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compact, "MAX_FAMILIES", 2)
    pack(deployment("a"), "one")
    pack(deployment("a"), "two")
    raw, dictionary = pack(deployment("b"), "three")
    assert dictionary == NO_DICTIONARY
    assert unpack(raw, dictionary) == deployment("b")
    assert len(compact._dictionaries) == 2


def test_a_rendering_gives_back_each_child_as_rendered() -> None:
    plans = [make_plan(seed(**{"metadata.name": f"s{i}", "metadata.uid": f"uid-{i}"})) for i in range(3)]
    for plan in plans:
        assert plan.base is not None
        rendered = plan.base.children()
        again = Rendering(json.loads(json.dumps(rendered)))
        assert again.children() == rendered
        assert again.digests == plan.base.digests
    last = plans[-1].base
    assert last is not None
    assert last.packed_bytes() * 4 < sum(len(pack(child)[0]) for child in last.children())
