"""The first decode step, at the crash site, on every release: `first_decode.py` builds two prefilled requests
and an IDLE batch in SGLang's own pools, runs the decode loop's prebuilt-batch path (which seeds the draft input
through the dispatcher) and then the real `ScheduleBatch.prepare_for_decode`, once as shipped and once with the
fix loaded through SGLang's plugin loader.

What is expected as shipped comes from the capability table (the probes' finding of which algorithms have a PD
builder in each wheel), so this file checks the table against the crash itself, by a second route."""

from __future__ import annotations

from typing import Any

import pytest

from specserving import capabilities

from .conftest import ROOT, VERSIONS, Runner, python_run, runs_for

pytestmark = pytest.mark.decode_path

SCRIPT = str(ROOT / "tests/decode_path/first_decode.py")
CRASH = "AttributeError: 'NoneType' object has no attribute 'prepare_for_decode'"
PROMPTS, BONUS, BLOCK = [5, 7], [101, 102], 4


def first_decode(version: str) -> list[Any]:
    return [python_run(version, SCRIPT)]


def upstream_builders(version: str) -> frozenset[str]:
    return capabilities.load().versions[version].upstream


def assert_crashed_at_the_field_site(result: dict[str, Any], where: str) -> None:
    assert result.get("prepared") is False, f"{where}: expected the field crash, got {result}"
    # ScheduleBatch.prepare_for_decode calls the draft input itself up to 0.5.14, then through a helper.
    assert result["error"] == CRASH and result["raisedIn"] in ("prepare_for_decode", "spec_prepare_for_decode"), (
        f"{where}: {result['error']} in {result['raisedIn']}")


def assert_decode_step_ready(result: dict[str, Any], where: str) -> None:
    """The state the first decode forward reads: committed KV is the prompt, the verify block's slots are
    allocated (two blocks ahead, as the DFLASH family reserves), every slot is distinct, and the request's
    req_to_token row holds its prefill slots followed by the new ones."""
    assert result.get("prepared") is True, f"{where}: {result.get('error')}\n{result.get('traceback', '')}"
    assert result["forwardMode"] == "DECODE", where
    assert result["draftInput"] == result["draftInputAfter"] == "DFlashDraftInputV2", where
    assert result["kvCommittedLen"] == PROMPTS, where
    assert result["kvAllocatedLen"] == [n + 2 * BLOCK for n in PROMPTS], where
    assert result["slotsTaken"] == 2 * BLOCK * len(PROMPTS), where
    assert result["seqLensCpu"] == PROMPTS, where
    assert result["reservedSeqLens"] in (None, [n + 2 * BLOCK for n in PROMPTS]), where
    rows, prefill = result["rows"], result["prefillSlots"]
    for row, slots, n in zip(rows, prefill, PROMPTS, strict=True):
        assert row[:n] == slots, f"{where}: the prompt's KV slots were overwritten: {row}"
    every_slot = [slot for row in rows for slot in row]
    assert 0 not in every_slot, f"{where}: slot 0 is the allocator's padding slot: {rows}"
    assert len(set(every_slot)) == len(every_slot), f"{where}: a KV slot is shared: {rows}"


def assert_relay_resolved(result: dict[str, Any], where: str) -> None:
    assert result.get("relayResolved") is True, f"{where}: {result.get('error')}\n{result.get('traceback', '')}"
    relay = result["relay"]
    assert relay["seqLens"] == relay["seqLensCpu"] == PROMPTS, where
    assert relay["bonusTokens"] == BONUS, f"{where}: the prefill's first tokens did not reach the forward"
    assert relay["futureIndices"] == relay["reqPoolIndices"], where


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(first_decode)
def test_first_decode_with_the_fix_prepares_the_step(runner: Runner, version: str) -> None:
    out = runner.json(python_run(version, SCRIPT))
    assert out["sglang"] == version
    assert out["fix"]["applied"] is True
    family = ["DFLASH"] + (["DSPARK"] if version >= "0.5.16" else [])
    assert out["algorithms"] == family
    for alg in family:
        assert_decode_step_ready(out["withFix"][f"{alg}/plain"], f"{version} {alg} plain")
        overlap = out["withFix"][f"{alg}/overlap"]
        assert_decode_step_ready(overlap, f"{version} {alg} overlap")
        assert_relay_resolved(overlap, f"{version} {alg} overlap")


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(first_decode)
def test_first_decode_as_shipped_crashes_exactly_where_the_builder_is_missing(runner: Runner, version: str) -> None:
    """Failure point 1: the field crash, on the real code, wherever the capability table says a builder is
    missing; and no crash where it says one is there."""
    out = runner.json(python_run(version, SCRIPT))
    have = upstream_builders(version)
    for alg in out["algorithms"]:
        for mode in ("plain", "overlap"):
            result, where = out["upstream"][f"{alg}/{mode}"], f"{version} {alg} {mode} as shipped"
            if alg in have:
                assert_decode_step_ready(result, where)
            else:
                assert_crashed_at_the_field_site(result, where)
    # The field report's two cases, by name, so a table regenerated wrongly cannot hide them.
    if version == "0.5.16":
        assert_crashed_at_the_field_site(out["upstream"]["DSPARK/plain"], "0.5.16 DSPARK")
    if version == "0.5.18":
        assert_crashed_at_the_field_site(out["upstream"]["DFLASH/plain"], "0.5.18 DFLASH")


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(first_decode)
def test_idle_and_unseeded_batches_meet_the_guard(runner: Runner, version: str) -> None:
    """Failure point 4 on every release: as shipped, an IDLE batch (no requests, no draft input) crashes at
    the field site; with the guard it gets an empty draft input and SGLang's step runs. A batch with requests
    but no draft input gets the cause named instead of 'NoneType'."""
    out = runner.json(python_run(version, SCRIPT))
    for alg in out["algorithms"]:
        assert_crashed_at_the_field_site(out["upstream"][f"{alg}/idle"], f"{version} {alg} idle as shipped")
        assert_crashed_at_the_field_site(out["upstream"][f"{alg}/unseeded"], f"{version} {alg} unseeded as shipped")
        idle = out["withFix"][f"{alg}/idle"]
        assert idle.get("prepared") is True, f"{version} {alg} idle: {idle.get('error')}"
        assert idle["draftInputAfter"] == "DFlashDraftInputV2" and idle["slotsTaken"] == 0
        unseeded = out["withFix"][f"{alg}/unseeded"]
        assert unseeded["prepared"] is False
        assert unseeded["error"].startswith(f"RuntimeError: {alg} decode batch of 2 request(s)")
        assert "without a draft input" in unseeded["error"]


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(first_decode)
def test_overlap_relay_is_needed_where_the_fix_adds_the_builder(runner: Runner, version: str) -> None:
    """Failure point 3: with the fix's relay seeding switched off, the first overlapped step has nothing to
    resolve from, from 0.5.15 to 0.5.19. On 0.5.14 the draft input carries its tokens directly
    (`direct_carry_valid`), and the step runs without the relay; the relay seeding does no harm there."""
    out = runner.json(python_run(version, SCRIPT))
    ours = set(out["algorithms"]) - upstream_builders(version)
    assert set(out["relayRemoved"]) == ours
    for alg in sorted(ours):
        result, where = out["relayRemoved"][alg], f"{version} {alg} without the relay"
        if version == "0.5.14":
            assert_decode_step_ready(result, where)
            assert result["relay"]["bonusTokens"] == BONUS, where
        else:
            assert result.get("relayResolved") is False, f"{where}: expected the relay to fail, got {result}"
            assert result["error"] == "AttributeError: 'NoneType' object has no attribute 'shape'", where
            assert result["raisedIn"] == "_resolve_spec_extras", where
