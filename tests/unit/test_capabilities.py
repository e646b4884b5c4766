"""The capability table: its facts, and reading SGLang versions from image references."""

from __future__ import annotations

import pytest

from specserving.capabilities import NEEDS_FIX, NO_BUILDER, UNKNOWN_VERSION, UPSTREAM, load, version_from_image, version_key

TABLE = load()
EAGLE_FAMILY = {"EAGLE", "EAGLE3", "FROZEN_KV_MTP"}


def test_every_supported_version_is_in_the_table() -> None:
    for v in ["0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
              "0.5.22", "0.5.23"]:
        assert TABLE.lookup(v) is not None, v


def test_eagle_family_has_a_builder_everywhere() -> None:
    for caps in TABLE.versions.values():
        assert EAGLE_FAMILY <= caps.upstream


def test_dspark_upstream_from_0_5_17_and_dflash_from_0_5_20() -> None:
    for v, caps in TABLE.versions.items():
        assert ("DSPARK" in caps.upstream) == (version_key(v) >= version_key("0.5.17")), v
        assert ("DFLASH" in caps.upstream) == (version_key(v) >= version_key("0.5.20")), v
        assert ("DSPARK" in caps.algorithms) == (version_key(v) >= version_key("0.5.16")), v


def test_fix_adds_dspark_and_dflash_on_0_5_16() -> None:
    caps = TABLE.lookup("0.5.16")
    assert caps is not None
    assert {"DSPARK", "DFLASH"} <= caps.with_fix
    assert not {"DSPARK", "DFLASH"} & caps.upstream


def test_some_algorithms_never_have_a_builder() -> None:
    for caps in TABLE.versions.values():
        assert not {"STANDALONE", "NGRAM", "UNO"} & caps.with_fix


def test_fix_never_removes_an_upstream_builder() -> None:
    for caps in TABLE.versions.values():
        assert caps.upstream <= caps.with_fix


@pytest.mark.parametrize(("image", "version"), [
    ("lmsysorg/sglang:v0.5.16-cu129", "0.5.16"),
    ("lmsysorg/sglang:v0.5.15.post1-cu126", "0.5.15.post1"),
    ("lmsysorg/sglang:0.5.23", "0.5.23"),
    ("registry:5000/lmsysorg/sglang:v0.5.20-cu129-amd64", "0.5.20"),
    ("lmsysorg/sglang:v0.5.20@sha256:" + "a" * 64, "0.5.20"),
    ("lmsysorg/sglang:latest", None),
    ("lmsysorg/sglang", None),
    ("registry:5000/sglang", None),
    ("lmsysorg/sglang@sha256:" + "b" * 64, None),
])
def test_version_from_image(image: str, version: str | None) -> None:
    assert version_from_image(image) == version


@pytest.mark.parametrize(("version", "algorithm", "with_fix", "kind", "runs"), [
    ("0.5.17", "DSPARK", False, UPSTREAM, True),
    ("0.5.16", "DSPARK", False, NEEDS_FIX, False),
    ("0.5.16", "DSPARK", True, NEEDS_FIX, True),
    ("0.5.18", "DFLASH", True, NEEDS_FIX, True),
    ("0.5.18", "NGRAM", True, NO_BUILDER, False),
    ("0.9.99", "EAGLE3", True, UNKNOWN_VERSION, False),
    (None, "EAGLE3", False, UNKNOWN_VERSION, False),
])
def test_verdict_kinds(version: str | None, algorithm: str, with_fix: bool, kind: str, runs: bool) -> None:
    verdict = TABLE.verdict(version, algorithm, with_fix=with_fix)
    assert (verdict.kind, verdict.runs) == (kind, runs)
    if kind == UNKNOWN_VERSION:
        assert verdict.builders == frozenset() and not verdict.knows_algorithm
    else:
        caps = TABLE.versions[version]
        assert verdict.builders == (caps.with_fix if with_fix else caps.upstream)
        assert verdict.runs == (algorithm in verdict.builders)


def test_verdict_knows_whether_a_version_has_the_algorithm_at_all() -> None:
    # UNO is not an algorithm of any supported version; EAGLE3 is of every one.
    assert not TABLE.verdict("0.5.16", "UNO", with_fix=True).knows_algorithm
    assert TABLE.verdict("0.5.16", "EAGLE3", with_fix=True).knows_algorithm
