"""SGLang's own start-up checks pass on every server command line we render: each example's prefill and decode
lines, and a fixed sample of generated valid SpecServings (the reliability tier's `valid_specs`, three per
release), go through the release's `ServerArgs`: its parser, `__post_init__` (the handlers that raise on bad
combinations) and, from 0.5.19, `resolve_once()`. `server_args_check.py` names the stand-ins (an H200's device
answers, the NICs' sysfs listing, config-only checkpoints) and what each cannot show.

A line SGLang refuses is a line a pod would crash on at start; admission should have refused its SpecServing."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from .conftest import ROOT, VERSIONS, Run, Runner, python_run, runs_for

pytestmark = pytest.mark.decode_path

SCRIPT = str(ROOT / "tests/decode_path/server_args_check.py")
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
PER_VERSION = 3
SAMPLE_DRAWS = 400
# The stand-in checkpoint (server_args_check.CONFIGS) behind each example's model and draft paths.
EXAMPLE_CHECKPOINTS = {
    "/data2/DeepSeek-V4-Flash-DSpark": "deepseek-v4-dspark",
    "/data/Kimi-K3": "kimi-k3",
    "/data/Kimi-K3-DFlash": "dflash-kimi-k3",
    "/models/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "/models/EAGLE3-Llama-3.1-70B": "eagle3-llama-3.1-70b",
}
# Generated specs name no model: each algorithm is served from a stand-in every release knows (target, draft).
# Kimi-K3's config class arrives in 0.5.17, so DFLASH's sample runs on Llama-3.1-70B with a DFlash draft.
ALGORITHM_CHECKPOINTS = {
    "DSPARK": ("deepseek-v4-dspark", "deepseek-v4-dspark"),
    "DFLASH": ("llama-3.1-70b", "dflash-llama-3.1-70b"),
    "EAGLE": ("llama-3.1-70b", "eagle3-llama-3.1-70b"),
    "EAGLE3": ("llama-3.1-70b", "eagle3-llama-3.1-70b"),
    "FROZEN_KV_MTP": ("llama-3.1-70b", "llama-3.1-70b"),
}


def _checkpoints(obj: dict[str, Any]) -> tuple[Any, Any]:
    speculative = obj["spec"]["speculative"]
    if obj["spec"]["model"]["path"] in EXAMPLE_CHECKPOINTS:
        model = EXAMPLE_CHECKPOINTS[obj["spec"]["model"]["path"]]
        return model, EXAMPLE_CHECKPOINTS.get(speculative.get("draftModelPath", ""), model)
    model, draft = ALGORITHM_CHECKPOINTS[speculative["algorithm"]]
    if speculative["algorithm"] == "DSPARK" and "numDraftTokens" in speculative and "blockSize" not in speculative:
        # SGLang takes DSPARK's gamma from the checkpoint (dspark_block_size) and refuses numDraftTokens other
        # than gamma + 1: the stand-in is a checkpoint trained for the spec's verify window. Admission cannot
        # read a checkpoint; docs/admission.md says this is checked at start-up only.
        gamma = {"dspark_block_size": speculative["numDraftTokens"] - 1}
        return [model, gamma], [draft, gamma]
    return model, draft


def _server_cases(obj: dict[str, Any], label: str) -> tuple[str, list[dict[str, Any]]]:
    """(SGLang version, one case per prefill and decode container the SpecServing renders)."""
    from specserving.api.loading import spec_of
    from specserving.rendering import render
    from specserving.rendering.image import base_image

    spec = spec_of(obj)
    model, draft = _checkpoints(obj)
    cases = []
    for manifest in render(spec, obj["metadata"]):
        role = manifest["metadata"].get("labels", {}).get("specserving.io/role")
        if role not in ("prefill", "decode") or manifest["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        for part, template in _pod_templates(manifest):
            for container in template["spec"]["containers"]:
                if not container.get("args"):
                    continue
                env = {e["name"]: e["value"] for e in container.get("env", []) if isinstance(e.get("value"), str)}
                cases.append({"label": f"{label} {role} {part}{container['name']}", "args": container["args"],
                              "env": env, "model": model, "draft": draft})
    return str(base_image(spec).sglang_version), cases


def _pod_templates(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(part, template): a Deployment's one template, or a LeaderWorkerSet's leader and worker templates."""
    if manifest["kind"] == "Deployment":
        return [("", manifest["spec"]["template"])]
    group = manifest["spec"]["leaderWorkerTemplate"]
    parts = [("leader/", group.get("leaderTemplate")), ("worker/", group["workerTemplate"])]
    return [(part, template) for part, template in parts if template]


@functools.cache
def example_cases() -> dict[str, list[dict[str, Any]]]:
    by_version: dict[str, list[dict[str, Any]]] = {}
    for example in EXAMPLES:
        for obj in yaml.safe_load_all(example.read_text()):
            if obj:
                version, cases = _server_cases(obj, example.stem)
                by_version.setdefault(version, []).extend(cases)
    return by_version


@functools.cache
def sampled_specs() -> dict[str, list[dict[str, Any]]]:
    """The first PER_VERSION admitted SpecServings per release among SAMPLE_DRAWS drawn by `valid_specs`, drawn
    derandomized: the same sample on every run, so a failure here reproduces."""
    from reliability.specs import valid_specs
    from specserving.validation import validate

    drawn: list[dict[str, Any]] = []

    @settings(max_examples=SAMPLE_DRAWS, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(valid_specs(prefix="sa"))
    def draw(obj: dict[str, Any]) -> None:
        drawn.append(copy.deepcopy(obj))

    draw()
    # Distinct algorithms first, then distinct shapes: consecutive draws are often near copies.
    by_version: dict[str, list[dict[str, Any]]] = {}
    admitted = [obj for obj in drawn if validate({**obj, "metadata": {**obj["metadata"], "namespace": "ns"}}).ok]
    for key in (_algorithm, _summary):
        for obj in admitted:
            chosen = by_version.setdefault(_version(obj), [])
            if len(chosen) < PER_VERSION and key(obj) not in {key(o) for o in chosen}:
                chosen.append(obj)
    return by_version


def _version(obj: dict[str, Any]) -> str:
    return str(obj["spec"]["image"]["base"].split(":v")[1].removesuffix("-cu129"))


def _algorithm(obj: dict[str, Any]) -> str:
    return str(obj["spec"]["speculative"]["algorithm"])


@functools.cache
def sample_cases() -> dict[str, list[dict[str, Any]]]:
    by_version: dict[str, list[dict[str, Any]]] = {}
    for version, objs in sampled_specs().items():
        for obj in objs:
            rendered_version, cases = _server_cases(obj, f"{obj['metadata']['name']} ({_summary(obj)})")
            by_version.setdefault(rendered_version, []).extend(cases)
    return by_version


def _summary(obj: dict[str, Any]) -> str:
    spec = obj["spec"]
    engine = spec["engine"]
    return (f"{spec['speculative']['algorithm']} tp{engine['tp']} dp{engine['dp']} "
            f"nodes{spec['decode']['nodesPerReplica']} {spec['transfer']['backend']}")


def negative_control() -> dict[str, Any]:
    """The seed's decode line without --enable-dp-lm-head: argparse takes it, SGLang's DSPARK handler refuses it
    at start-up. If this passes, the harness is not running SGLang's checks."""
    case = next(c for c in example_cases()["0.5.17"] if c["label"] == "dspark-pd-tp8dp8 decode sglang")
    return {**case, "label": "negative control", "args": [a for a in case["args"] if a != "--enable-dp-lm-head"]}


# SpecServings admission refuses because SGLang would stop at start-up: (label, example, version floor, speculative
# settings, the field admission names, what SGLang says). Rendered anyway, their decode lines must be refused by
# each release's ServerArgs too, so the hand-written rules stay tied to the code they copy.
REFUSED = (
    ("eagle numSteps without eagleTopk", "eagle3-pd-tp8", "0.5.14",
     {"algorithm": "EAGLE3", "draftModelPath": "/models/EAGLE3-Llama-3.1-70B", "numSteps": 3, "numDraftTokens": 4},
     "spec.speculative.eagleTopk", "TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
    ("dspark numDraftTokens not blockSize + 1", "dspark-pd-tp8dp8", "0.5.16",
     {"algorithm": "DSPARK", "blockSize": 4, "numDraftTokens": 4},
     "spec.speculative.numDraftTokens", "ValueError: DSpark speculative_num_draft_tokens must equal gamma + 1"),
)


def _example(stem: str) -> dict[str, Any]:
    return next(o for o in yaml.safe_load_all((ROOT / "examples" / f"{stem}.yaml").read_text()) if o)


def refused_spec(version: str, refusal: tuple[Any, ...]) -> dict[str, Any]:
    _, stem, _, speculative, _, _ = refusal
    obj = copy.deepcopy(_example(stem))
    obj["spec"]["image"]["base"] = f"lmsysorg/sglang:v{version}-cu129"
    obj["spec"]["speculative"] = speculative
    return obj


@functools.cache
def refused_cases(version: str) -> list[dict[str, Any]]:
    cases = []
    for refusal in REFUSED:
        if _at_least(version, refusal[2]):
            _, found = _server_cases(refused_spec(version, refusal), refusal[0])
            cases += [{**c, "label": f"refused: {refusal[0]}"} for c in found if " decode " in c["label"]]
    return cases


def _at_least(version: str, floor: str) -> bool:
    return VERSIONS.index(version) >= VERSIONS.index(floor)


def checks_run(version: str) -> Run:
    """One interpreter per release: its examples (and the negative control), its sample, its refusals."""
    cases = example_cases().get(version, []) + ([negative_control()] if version == "0.5.17" else [])
    return python_run(version, SCRIPT, json.dumps(cases + sample_cases()[version] + refused_cases(version)))


def outcomes(runner: Runner, version: str) -> dict[str, dict[str, Any]]:
    result = runner.json(checks_run(version))
    by_label = {r["label"]: r for r in result["results"]}
    assert len(by_label) == len(result["results"]), "two cases share a label"
    return by_label


def _refused(outcome: dict[str, dict[str, Any]], cases: list[dict[str, Any]]) -> dict[str, str]:
    return {c["label"]: outcome[c["label"]]["error"] for c in cases if outcome[c["label"]]["error"]}


def test_every_release_is_sampled() -> None:
    assert sorted(sampled_specs()) == sorted(VERSIONS), (
        f"{SAMPLE_DRAWS} draws left releases without an admitted spec: raise SAMPLE_DRAWS")
    assert {len(objs) for objs in sampled_specs().values()} == {PER_VERSION}


@pytest.mark.parametrize("version", sorted({v for v in example_cases()} & set(VERSIONS)))
@runs_for(lambda version: [checks_run(version)])
def test_every_example_passes_sglangs_start_up_checks(runner: Runner, version: str) -> None:
    outcome = outcomes(runner, version)
    if version == "0.5.17":
        assert (outcome["negative control"]["error"] or "").startswith(
            "ValueError: DSpark with dp attention requires --enable-dp-lm-head"), (
            "the seed's decode line without --enable-dp-lm-head was not refused: SGLang's checks did not run")
    cases = example_cases()[version]
    refused = _refused(outcome, cases)
    assert not refused, f"sglang {version} refuses rendered example lines at start-up: {refused}"
    for case in cases:
        resolved = outcome[case["label"]]["resolved"]
        assert resolved["disaggregation_mode"] in case["label"].split(), (case["label"], resolved)
        args = case["args"]
        algorithm = args[args.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in args else None
        assert (resolved["speculative_algorithm"], resolved["device"]) == (algorithm, "cuda"), (case["label"], resolved)


def test_every_example_line_is_checked() -> None:
    versions = set(example_cases())
    assert versions <= set(VERSIONS), f"examples on releases outside the tier: {versions - set(VERSIONS)}"
    roles = {c["label"].split()[1] for cases in example_cases().values() for c in cases}
    assert roles == {"prefill", "decode"}
    assert {c["label"].split()[0] for cases in example_cases().values() for c in cases} == {p.stem for p in EXAMPLES}


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(lambda version: [checks_run(version)])
def test_sampled_specs_pass_sglangs_start_up_checks(runner: Runner, version: str) -> None:
    outcome = outcomes(runner, version)
    cases = sample_cases()[version]
    assert len(cases) >= 2 * PER_VERSION
    refused = _refused(outcome, cases)
    assert not refused, f"sglang {version} refuses lines rendered from admitted specs: {json.dumps(refused, indent=1)}"


@pytest.mark.parametrize("version", VERSIONS)
@runs_for(lambda version: [checks_run(version)])
def test_admission_refuses_what_sglang_refuses_at_start_up(runner: Runner, version: str) -> None:
    from specserving.validation import validate

    outcome = outcomes(runner, version)
    applicable = [r for r in REFUSED if _at_least(version, r[2])]
    assert applicable, f"no refusal applies to {version}"
    for refusal in applicable:
        label, _, _, _, path, sglang_says = refusal
        obj = refused_spec(version, refusal)
        paths = [p.path for p in validate({**obj, "metadata": {**obj["metadata"], "namespace": "ns"}}).errors]
        assert path in paths, f"{label}: admission does not refuse it on {version}: {paths}"
        error = outcome[f"refused: {label}"]["error"] or ""
        assert error.startswith(sglang_says), f"{label}: sglang {version} says {error!r}, not {sglang_says!r}"


def test_stand_ins_are_named_in_the_docs() -> None:
    docs = (ROOT / "docs/decode-path.md").read_text()
    for name in ("server_args_check.py", "H200", "/sys/class/infiniband", "config.json"):
        assert name in docs, f"docs/decode-path.md does not name the stand-in {name!r}"

