"""The probe on the real SGLang wheels, every version, without and with the decode-path fix.

The expectations below are what the wheels were found to do (docs/decode-path.md); they are written here
independently of the generated capability table so that the table cannot drift with the probe unnoticed.
"""

from __future__ import annotations

from typing import Any

import pytest
from packaging.version import Version

from .conftest import VERSIONS, Runner, python_run, runs_for

pytestmark = pytest.mark.decode_path

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "FROZEN_KV_MTP"})
FIXED = frozenset({"DFLASH", "DSPARK"})
NEVER = frozenset({"STANDALONE", "NGRAM", "UNO"})
BASE_ENUM = frozenset({"DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM"})


def _expected_enum(version: str) -> frozenset[str]:
    extra: set[str] = set()
    if Version(version) >= Version("0.5.16"):
        extra.add("DSPARK")
    if Version(version) >= Version("0.5.20"):
        extra.add("UNO")
    return BASE_ENUM | extra


def _expected_upstream(version: str) -> frozenset[str]:
    extra: set[str] = set()
    if Version(version) >= Version("0.5.17"):
        extra.add("DSPARK")  # dspark_disaggregation arrives in 0.5.17
    if Version(version) >= Version("0.5.20"):
        extra.add("DFLASH")  # shipped unused in 0.5.18-0.5.19, dispatched from 0.5.20
    return EAGLE_FAMILY | extra


UPSTREAM_BUILDER = {
    "DSPARK": "sglang.srt.speculative.dspark_disaggregation.build_dspark_disagg_draft_input",
    "DFLASH": "sglang.srt.speculative.dflash_disaggregation.build_dflash_disagg_draft_input",
    "EAGLE": "sglang.srt.speculative.eagle_disaggregation.build_eagle_disagg_draft_input",
}
OUR_BUILDER = "specserving_pdfix.builders.build_dflash_family_draft_input"


def test_every_version_is_covered() -> None:
    assert VERSIONS[0] == "0.5.14" and VERSIONS[-1] == "0.5.23" and len(VERSIONS) == 11


@pytest.mark.parametrize("version", VERSIONS)
def test_enum_members(reports: dict[str, Any], version: str) -> None:
    assert set(reports[version]["upstream"]["algorithms"]) == _expected_enum(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_upstream_builders(reports: dict[str, Any], version: str) -> None:
    up = reports[version]["upstream"]
    assert up["fixActive"] is False and up["dispatcher"] == "upstream"
    assert set(up["pdBuilders"]) == _expected_upstream(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_fix_adds_every_dflash_family_builder(reports: dict[str, Any], version: str) -> None:
    fixed = reports[version]["withFix"]
    assert fixed["fixActive"] is True, "the sglang.srt.plugins entry point did not apply the fix"
    expected = EAGLE_FAMILY | (FIXED & _expected_enum(version))
    assert set(fixed["pdBuilders"]) == expected
    assert not NEVER & set(fixed["pdBuilders"])


@pytest.mark.parametrize("version", VERSIONS)
def test_no_builder_raises(reports: dict[str, Any], version: str) -> None:
    for label in ("upstream", "withFix"):
        for alg, calls in reports[version][label]["results"].items():
            for mode, call in calls.items():
                assert call["error"] is None, f"{label} {alg} ({mode}): {call['error']}\n{call.get('traceback')}"


@pytest.mark.parametrize("version", VERSIONS)
def test_overlap_relay_is_seeded(reports: dict[str, Any], version: str) -> None:
    """Under overlap every draft input carries future_indices, and the future map saw publish + stash."""
    fixed = reports[version]["withFix"]
    for alg in fixed["pdBuilders"]:
        call = fixed["results"][alg]["overlap"]
        assert call["draftInput"] is not None, alg
        assert call["futureIndices"] == [3, 4], alg  # the stand-in batch's req_pool_indices
        assert call["published"] == [{"indices": [3, 4], "seq_lens": [5, 7]}], alg
        assert len(call["stashed"]) == 1 and call["stashed"][0]["indices"] == [3, 4], alg
        assert call["stashed"][0]["bonus_tokens"] == [100, 101], alg  # the prefill node's last tokens
    for alg in FIXED & set(fixed["pdBuilders"]):
        plain = fixed["results"][alg]["plain"]
        assert plain["draftInput"] == "DFlashDraftInputV2", alg


@pytest.mark.parametrize("version", VERSIONS)
def test_fix_only_fills_gaps(reports: dict[str, Any], version: str) -> None:
    """Where SGLang has a builder, the fix leaves it in place; ours runs only where one is missing."""
    up, fixed = reports[version]["upstream"], reports[version]["withFix"]
    for alg in fixed["pdBuilders"]:
        builder = fixed["results"][alg]["plain"]["builder"]
        if alg in up["pdBuilders"]:
            assert builder == up["results"][alg]["plain"]["builder"], alg
            assert builder != OUR_BUILDER, alg
        else:
            assert alg in FIXED and builder == OUR_BUILDER, alg
    if not (FIXED & _expected_enum(version)) - _expected_upstream(version):
        # Nothing missing: the dispatcher is SGLang's own function object, not a wrapper.
        assert fixed["dispatcher"] == "upstream" and fixed["dispatcherUnchanged"] is True
        assert "pd_builder" not in fixed["patches"]
    else:
        assert fixed["dispatcher"] == "specserving_pdfix"


def test_upstream_builders_run_on_0_5_23(reports: dict[str, Any]) -> None:
    fixed = reports["0.5.23"]["withFix"]
    assert fixed["dispatcherUnchanged"] is True
    for alg in ("DSPARK", "DFLASH", "EAGLE"):
        assert fixed["results"][alg]["plain"]["builder"] == UPSTREAM_BUILDER[alg]
        assert fixed["results"][alg]["overlap"]["builder"] == UPSTREAM_BUILDER[alg]
    assert set(fixed["patches"]) == {"decode_guard"}


@pytest.mark.parametrize(
    ("version", "args", "code", "stderr_has"),
    [
        ("0.5.16", ["--no-fix", "--require", "DSPARK,DFLASH"], 1, "no PD-decode draft-input builder for: DFLASH, DSPARK"),
        ("0.5.16", ["--require", "DSPARK,DFLASH,EAGLE"], 0, ""),
        ("0.5.15", ["--require", "DSPARK"], 1, "DSPARK not in this SGLang's SpeculativeAlgorithm"),
    ],
)
@runs_for(lambda version, args, code, stderr_has: [python_run(version, "-m", "specserving_pdfix.probe", *args)])
def test_require_exit_status(runner: Runner, version: str, args: list[str], code: int, stderr_has: str) -> None:
    proc = runner.result(python_run(version, "-m", "specserving_pdfix.probe", *args))
    assert proc.returncode == code, proc.stderr[-3000:]
    if code:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("specserving_pdfix.probe:")]
        assert len(lines) == 1 and stderr_has in lines[0], proc.stderr[-3000:]
