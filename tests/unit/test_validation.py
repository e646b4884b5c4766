"""One case per validation rule: the field path it blames and the words of its message."""

from __future__ import annotations

from typing import Any

import pytest

from specserving.api.naming import MAX_NAME_LENGTH
from specserving.validation import validate

from .builders import DELETE, seed

IB8 = [f"mlx5_{i}" for i in range(8)]
DFLASH = {"algorithm": "DFLASH", "draftModelPath": "/data2/draft"}

# (case id, changes to the seed example, blamed path, words the message must contain)
REFUSED: list[tuple[str, dict[str, Any], str, list[str]]] = [
    ("ngram-has-no-builder", {"spec.speculative.algorithm": "NGRAM"}, "spec.speculative.algorithm",
     ["NGRAM", "SGLang 0.5.17", "algorithms with one: DFLASH, DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP"]),
    ("uno-has-no-builder", {"spec.image.base": "lmsysorg/sglang:v0.5.23", "spec.speculative.algorithm": "UNO"},
     "spec.speculative.algorithm", ["UNO", "SGLang 0.5.23", "prepare_for_decode"]),
    ("standalone-has-no-builder", {"spec.speculative.algorithm": "STANDALONE"}, "spec.speculative.algorithm",
     ["STANDALONE", "choose an algorithm with a builder"]),
    ("dflash-0.5.18-without-fix", {"spec.image.base": "lmsysorg/sglang:v0.5.18-cu129",
                                   "spec.image.build": {"policy": "Never"}, "spec.speculative": DFLASH},
     "spec.speculative.algorithm",
     ["DFLASH", "SGLang 0.5.18", "in the base image", "build.policy to IfNeeded", "upgrade", "0.5.20"]),
    ("dspark-0.5.16-without-fix", {"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129",
                                   "spec.image.build": {"policy": "Never"}},
     "spec.speculative.algorithm", ["DSPARK", "SGLang 0.5.16", "build.policy to IfNeeded", "0.5.17"]),
    ("dspark-unknown-to-0.5.14", {"spec.image.base": "lmsysorg/sglang:v0.5.14-cu129"},
     "spec.speculative.algorithm", ["does not know the algorithm DSPARK"]),
    ("explicit-version-beats-the-tag", {"spec.image.base": "registry.local/sglang:prod",
                                        "spec.image.sglangVersion": "0.5.16",
                                        "spec.image.build": {"policy": "Never"}},
     "spec.speculative.algorithm", ["SGLang 0.5.16"]),
    ("dp-must-divide-tp", {"spec.engine.dp": 3}, "spec.engine.dp",
     ["spec.engine.tp must be divisible by spec.engine.dp", "got 8 and 3"]),
    ("ib-devices-must-match-gpus", {"spec.transfer.ibDevices": IB8[:4]}, "spec.transfer.ibDevices",
     ["lists 4 devices", "8 GPUs"]),
    ("mooncake-tcp-takes-no-ib-devices", {"spec.transfer.backend": "mooncake_tcp"}, "spec.transfer.ibDevices",
     ["mooncake_tcp", "remove ibDevices"]),
    ("tp-must-fit-the-nodes", {"spec.engine.tp": 16, "spec.engine.dp": 16, "spec.transfer.ibDevices": DELETE},
     "spec.prefill.nodesPerReplica", ["must split evenly", "raise nodesPerReplica"]),
    ("dspark-needs-dp-lm-head", {"spec.engine.enableDpLmHead": False}, "spec.engine.enableDpLmHead",
     ["--enable-dp-lm-head"]),
    ("dspark-needs-a-dp-moe-backend", {"spec.engine.moeA2aBackend": "deepep"}, "spec.engine.moeA2aBackend",
     ["deepep", "SGLang 0.5.17", "use one of none"]),
    ("dspark-0.5.17-refuses-megamoe", {"spec.engine.moeA2aBackend": "megamoe"}, "spec.engine.moeA2aBackend",
     ["megamoe", "use one of none"]),
    ("dspark-0.5.20-refuses-mori", {"spec.image.base": "lmsysorg/sglang:v0.5.20", "spec.engine.moeA2aBackend": "mori"},
     "spec.engine.moeA2aBackend", ["mori", "SGLang 0.5.20", "use one of none, megamoe"]),
    ("dflash-under-dp-attention-before-0.5.23", {"spec.image.base": "lmsysorg/sglang:v0.5.22",
                                                 "spec.speculative": DFLASH},
     "spec.engine.enableDpAttention", ["SGLang 0.5.22 refuses DFLASH under DP attention", "0.5.23"]),
    ("dflash-needs-a-draft-model", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                    "spec.speculative": {"algorithm": "DFLASH"}},
     "spec.speculative.draftModelPath", ["DFLASH needs a draft model"]),
    ("dflash-draft-tokens-equal-block-size", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                              "spec.speculative": {**DFLASH, "blockSize": 16, "numDraftTokens": 8}},
     "spec.speculative.numDraftTokens", ["equal to blockSize"]),
    ("block-size-only-for-dspark-and-dflash", {"spec.speculative": {"algorithm": "EAGLE", "blockSize": 4}},
     "spec.speculative.blockSize", ["DSPARK and DFLASH only"]),
    ("extra-args-may-not-set-owned-flags", {"spec.decode.extraArgs": ["--watchdog-timeout", "600", "--port=1"]},
     "spec.decode.extraArgs[2]", ["--port", "spec.engine.port"]),
    ("extra-args-alias-is-owned-too", {"spec.engine.extraArgs": ["--tp", "4"]}, "spec.engine.extraArgs[0]",
     ["--tp", "spec.engine.tp"]),
    ("a-prefix-of-an-owned-flag-is-owned", {"spec.decode.extraArgs": ["--disaggregation-mod", "prefill"]},
     "spec.decode.extraArgs[0]", ['"--disaggregation-mod" sets --disaggregation-mode']),
    ("a-prefix-cannot-bypass-the-builder-check", {"spec.decode.extraArgs": ["--speculative-al=NGRAM"]},
     "spec.decode.extraArgs[0]", ["sets --speculative-algorithm", "spec.speculative.algorithm"]),
    ("typed-moe-backend-is-owned", {"spec.engine.extraArgs": ["--moe-a2a-backend", "deepep"]},
     "spec.engine.extraArgs[0]", ["spec.engine.moeA2aBackend"]),
    ("config-file-refused", {"spec.prefill.extraArgs": ["--config", "/etc/sglang.yaml"]},
     "spec.prefill.extraArgs[0]", ["--config", "reads further flags from a file"]),
    ("help-refused", {"spec.router.extraArgs": ["--help"]}, "spec.router.extraArgs[0]", ["prints its help"]),
    ("unknown-flag", {"spec.decode.extraArgs": ["--no-such-flag"]}, "spec.decode.extraArgs[0]",
     ["SGLang 0.5.17 has no such option"]),
    ("flag-removed-in-0.5.20", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                "spec.decode.extraArgs": ["--cuda-graph-bs", "8"]},
     "spec.decode.extraArgs[0]", ["ambiguous option", "--cuda-graph-bs-decode, --cuda-graph-bs-prefill"]),
    ("pipeline-parallel-needs-more-gpus", {"spec.decode.extraArgs": ["--pp-size", "2"]}, "spec.decode.extraArgs[0]",
     ["tp x pp = 8 x 2 GPUs", "remove it"]),
    ("int-flag-with-a-word", {"spec.decode.extraArgs": ["--max-total-tokens", "many"]}, "spec.decode.extraArgs[1]",
     ["invalid integer", "'many'"]),
    ("flag-without-its-value", {"spec.decode.extraArgs": ["--page-size"]}, "spec.decode.extraArgs[0]",
     ["expected one argument"]),
    ("stray-value", {"spec.decode.extraArgs": ["--watchdog-timeout", "6", "7"]}, "spec.decode.extraArgs[2]",
     ["unrecognized arguments: 7"]),
    ("flag-set-twice", {"spec.decode.extraArgs": ["--watchdog-timeout", "1", "--watchdog-timeout=2"]},
     "spec.decode.extraArgs[2]", ["spec.decode.extraArgs[0] already sets --watchdog-timeout", "set it once"]),
    ("tool-call-parser-choice-per-version", {"spec.engine.toolCallParser": "deepseekv41"},
     "spec.engine.toolCallParser", ["SGLang 0.5.17", "invalid choice: 'deepseekv41'", "0.5.21"]),
    ("moe-runner-backend-choice", {"spec.engine.moeRunnerBackend": "foo"}, "spec.engine.moeRunnerBackend",
     ["invalid choice: 'foo'"]),
    ("router-port-is-owned", {"spec.router.extraArgs": ["--polic", "random"]}, "spec.router.extraArgs[0]",
     ["sets --policy", "spec.router.policy"]),
    ("router-static-workers-refused", {"spec.router.extraArgs": ["--prefill", "http://10.0.0.1:30000"]},
     "spec.router.extraArgs[0]", ["service discovery"]),
    ("router-unknown-flag", {"spec.router.implementation": "smg", "spec.router.extraArgs": ["--nope"]},
     "spec.router.extraArgs[0]", ["smg==1.13.0 has no such option"]),
    ("eagle-topk-needs-num-steps", {"spec.speculative": {"algorithm": "EAGLE", "eagleTopk": 4}},
     "spec.speculative.eagleTopk", ["set spec.speculative.numSteps too"]),
    ("eagle-draft-tokens-need-num-steps", {"spec.speculative": {"algorithm": "EAGLE3", "numDraftTokens": 4}},
     "spec.speculative.numDraftTokens", ["asserts that none is set"]),
    ("eagle-num-steps-needs-topk", {"spec.speculative": {"algorithm": "EAGLE3", "numSteps": 3,
                                                          "numDraftTokens": 4}},
     "spec.speculative.eagleTopk", ["Required value", "set eagleTopk"]),
    ("dspark-draft-tokens-are-block-size-plus-one", {"spec.speculative": {"algorithm": "DSPARK", "blockSize": 4,
                                                                         "numDraftTokens": 4}},
     "spec.speculative.numDraftTokens", ["DSPARK needs numDraftTokens equal to blockSize + 1"]),
    ("image-reference-grammar", {"spec.image.base": "Registry/Sglang:V0.5.17;rm"}, "spec.image.base",
     ["not a valid image reference", "lower-case"]),
    ("router-image-reference-grammar", {"spec.router.image": "Router:1;x"}, "spec.router.image",
     ["not a valid image reference"]),
    ("draft-model-outside-the-mount", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                       "spec.speculative": {"algorithm": "DFLASH", "draftModelPath": "/data2x/d"}},
     "spec.speculative.draftModelPath", ["must lie below spec.model.volume.mountPath (/data2)"]),
    ("fractional-tp", {"spec.engine.tp": 8.5}, "spec.engine.tp", ["must be of type integer"]),
    ("request-above-limit", {"spec.router.resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1G"}}},
     "spec.router.resources.requests.memory", ['"1Gi": must be less than or equal to the memory limit ("1G")']),
    ("node-selector-value-is-label-syntax", {"spec.decode.nodeSelector": {"gpu": "not valid!"}},
     "spec.decode.nodeSelector[gpu]", ["a label value is empty or up to 63"]),
    ("node-selector-key-is-label-syntax", {"spec.prefill.nodeSelector": {"-gpu": "h200"}},
     "spec.prefill.nodeSelector[-gpu]", ["a node label key"]),
    ("extra-args-may-not-switch-pd-roles", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                            "spec.prefill.extraArgs": ["--enable-pd-role-switch"]},
     "spec.prefill.extraArgs[0]", ["refuse every speculative algorithm"]),
    ("page-size-must-match-both-roles", {"spec.decode.extraArgs": ["--page-size", "64"]},
     "spec.decode.extraArgs[0]", ["--page-size must be equal on prefill and decode", "SGLang 0.5.17",
                                  "for prefill it is unset", "spec.decode.extraArgs[0] sets '64'"]),
    ("kv-dtype-mismatch-names-both-paths", {"spec.prefill.extraArgs": ["--kv-cache-dtype=fp8_e4m3"],
                                            "spec.decode.extraArgs": ["--kv-cache-dtype", "auto"]},
     "spec.decode.extraArgs[0]", ["spec.prefill.extraArgs[0] sets 'fp8_e4m3'", "spec.decode.extraArgs[0] sets 'auto'"]),
    ("a-pool-overriding-the-engine-is-blamed", {"spec.engine.extraArgs": ["--page-size", "64"],
                                                "spec.prefill.extraArgs": ["--page-size", "32"]},
     "spec.prefill.extraArgs[0]", ["spec.engine.extraArgs[0] sets '64'", "spec.prefill.extraArgs[0] sets '32'"]),
    ("dsv4-attention-backend-symmetric-from-0.5.23", {"spec.image.base": "lmsysorg/sglang:v0.5.23",
                                                      "spec.prefill.extraArgs": ["--dsv4-attn-backend", "x"]},
     "spec.prefill.extraArgs[0]", ["--dsv4-attn-backend", "SGLang 0.5.23"]),
    ("sglang-router-cannot-route-dp-ranks", {"spec.router.dpAware": True}, "spec.router.dpAware",
     ["sglang-router (0.3.2)", "http://0.0.0.<rank>/generate", "implementation: smg"]),
    ("name-too-long", {"metadata.name": "x" * (MAX_NAME_LENGTH + 1)}, "",
     [f"metadata.name must be at most {MAX_NAME_LENGTH} characters"]),
    ("volume-needs-one-source", {"spec.model.volume": {"mountPath": "/data2"}}, "spec.model.volume",
     ["exactly one of persistentVolumeClaim, hostPath or nfs"]),
    ("model-path-below-the-mount", {"spec.model.volume.mountPath": "/models"}, "spec.model.path",
     ["below volume.mountPath"]),
    ("multus-needs-networks", {"spec.transfer.network": {"mode": "Multus"}},
     "spec.transfer.network.multusNetworks", ["at least one"]),
    ("unknown-field", {"spec.engine.tensorParallel": 8}, "spec.engine.tensorParallel", ["unknown field"]),
    ("enum", {"spec.transfer.backend": "rdma"}, "spec.transfer.backend",
     ['Unsupported value: "rdma"', '"mooncake", "mooncake_tcp", "nixl"']),
    ("bounds", {"spec.decode.replicas": -1}, "spec.decode.replicas", ["greater than or equal to 0"]),
    ("required", {"spec.model": {"trustRemoteCode": True}}, "spec.model.path", ["Required value"]),
    ("fraction-is-a-quoted-decimal", {"spec.engine.memFractionStatic": 0.8}, "spec.engine.memFractionStatic",
     ["must be of type string"]),
]


@pytest.mark.parametrize(("changes", "path", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_with_path_and_message(changes: dict[str, Any], path: str, words: list[str]) -> None:
    report = validate(seed(**changes))
    assert not report.ok
    blamed = [e for e in report.errors if e.path == path]
    assert blamed, f"no error at {path!r}; got {[str(e) for e in report.errors]}"
    for word in words:
        assert any(word in e.message for e in blamed), f"{word!r} not in {[e.message for e in blamed]}"


def test_every_error_is_reported_at_once() -> None:
    report = validate(seed(**{"spec.engine.dp": 3, "spec.transfer.ibDevices": IB8[:2],
                              "spec.speculative.algorithm": "NGRAM", "spec.decode.extraArgs": ["--host", "x"]}))
    paths = {e.path for e in report.errors}
    assert {"spec.engine.dp", "spec.transfer.ibDevices", "spec.speculative.algorithm",
            "spec.decode.extraArgs[0]"} <= paths


@pytest.mark.parametrize("changes", [
    {},
    {"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"},  # DSPARK on 0.5.16 is fine when the fix may be built
    {"spec.image.base": "lmsysorg/sglang:v0.5.23", "spec.speculative": {**DFLASH, "blockSize": 16}},
    {"spec.image.base": "lmsysorg/sglang:v0.5.18", "spec.engine.moeA2aBackend": "megamoe"},
    {"spec.image.base": "lmsysorg/sglang:v0.5.21", "spec.engine.moeA2aBackend": "mori"},
    {"spec.image.base": "lmsysorg/sglang:v0.5.18", "spec.engine.dp": 1, "spec.engine.enableDpLmHead": False},
    {"spec.image.base": "lmsysorg/sglang:v0.5.14", "spec.speculative.algorithm": "EAGLE"},
    {"spec.decode.extraArgs": ["--watchdog-timeout", "600"]},
    {"spec.engine.extraArgs": ["--page-size", "64"]},
    {"spec.prefill.extraArgs": ["--page-size", "64"], "spec.decode.extraArgs": ["--page-size=64"]},
    {"spec.image.base": "lmsysorg/sglang:v0.5.22", "spec.prefill.extraArgs": ["--dsv4-attn-backend", "flashmla"]},
], ids=["seed", "dspark-0.5.16-fixed", "dflash-0.5.23", "dspark-megamoe-0.5.18", "dspark-mori-0.5.21",
        "dspark-dp1-needs-no-lm-head-from-0.5.18", "eagle-0.5.14", "harmless-extra-args",
        "page-size-once-for-both", "page-size-alike-in-both", "dsv4-backend-per-role-before-0.5.23"])
def test_accepted(changes: dict[str, Any]) -> None:
    report = validate(seed(**changes))
    assert report.ok, report.summary()


@pytest.mark.parametrize(("changes", "path", "word"), [
    ({"spec.image.base": "lmsysorg/sglang:latest"}, "spec.image.sglangVersion", "cannot tell the SGLang version"),
    ({"spec.image.sglangVersion": "0.6.0"}, "spec.image.sglangVersion", "not in the capability table"),
    ({"spec.prefill.speculativeDecoding": "Disabled"}, "spec.prefill.speculativeDecoding", "without speculative"),
    ({"spec.decode.extraArgs": ["--context-length", "8192"]}, "spec.decode.extraArgs[0]", "--context-length differs"),
    ({"spec.image.sglangVersion": "0.6.0"}, "spec.router.implementation", "is not recorded"),
    ({"spec.decode.extraArgs": ["--watchdog", "600"]}, "spec.decode.extraArgs[0]",
     "abbreviates --watchdog-timeout; spell it in full"),
    ({"spec.engine.extraArgs": ["--watchdog-timeout", "600"], "spec.decode.extraArgs": ["--watchdog-timeout", "60"]},
     "spec.decode.extraArgs[0]", "overrides spec.engine.extraArgs[0]"),
    ({"spec.image.sglangVersion": "0.6.0", "spec.decode.extraArgs": ["--brand-new-flag"]}, "spec.decode.extraArgs[0]",
     "the image's version is not known, so its own parser decides"),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.23", "spec.router.implementation": "smg",
      "spec.engine.extraArgs": ["--disable-cuda-graph"]}, "spec.engine.extraArgs[0]", "deprecated in SGLang 0.5.23"),
], ids=["untagged-image", "unknown-version", "prefill-without-speculation", "context-length-differs",
        "router-of-an-unknown-version", "abbreviation", "pool-overrides-engine", "flag-unknown-to-every-version",
        "deprecated-flag"])
def test_warnings_do_not_refuse(changes: dict[str, Any], path: str, word: str) -> None:
    report = validate(seed(**changes))
    assert report.ok, report.summary()
    assert any(w.path == path and word in w.message for w in report.warnings), report.warnings


def test_wrong_kind_is_malformed() -> None:
    report = validate({**seed(), "kind": "Deployment"})
    assert report.malformed and report.errors[0].path == "kind"


def test_a_recorded_or_chosen_router_gives_no_warning() -> None:
    for changes in ({}, {"spec.image.sglangVersion": "0.6.0", "spec.router": {"implementation": "smg"}}):
        report = validate(seed(**changes))
        assert not [w for w in report.warnings if w.path == "spec.router.implementation"], report.warnings


@pytest.mark.parametrize(("resources", "path", "words"), [
    ({"limits": "abc"}, "spec.decode.resources.limits", "must be a map of resource name to quantity"),
    ({"requests": None}, "spec.decode.resources.requests", "must be a map of resource name to quantity"),
    ({"limits": {"memory": "lots"}}, "spec.decode.resources.limits.memory", "must be a Kubernetes quantity"),
    ({"limits": {"memory": True}}, "spec.decode.resources.limits.memory", "must be a Kubernetes quantity"),
    ({"limitz": {}}, "spec.decode.resources.limitz", "resources takes requests and limits"),
])
def test_malformed_resources_are_refused_before_they_reach_the_renderer(resources: dict[str, Any], path: str,
                                                                      words: str) -> None:
    from specserving.rendering import render

    report = validate(seed(**{"spec.decode.resources": resources}))
    assert [e.path for e in report.errors] == [path] and words in report.errors[0].message
    ok = validate(seed(**{"spec.decode.resources": {"limits": {"memory": "64Gi", "cpu": 4},
                                                     "requests": {"cpu": "500m", "ephemeral-storage": "1e9"}}}))
    assert ok.ok, ok.errors
    assert ok.spec is not None and render(ok.spec, {"name": "x"})


@pytest.mark.parametrize(("changes", "path", "words"), [
    ({"spec.decode.extraArgs": ["--moe-a2a-backend", "deepep"]}, "spec.decode.extraArgs[0]",
     "spec.engine.moeA2aBackend"),
    ({"spec.engine.extraArgs": ["--mem-fraction-static=0.9"]}, "spec.engine.extraArgs[0]",
     "spec.engine.memFractionStatic"),
    ({"spec.prefill.extraArgs": ["--config", "/etc/sglang.yaml"]}, "spec.prefill.extraArgs[0]",
     "reads further flags from a file"),
    ({"spec.engine.env": [{"name": "SGLANG_RAGGED_VERIFY_MODE", "value": "dynamic"}]}, "spec.engine.env[0].name",
     "spec.speculative.algorithm"),
    ({"spec.decode.env": [{"name": "SGLANG_HOST_IP", "value": "1.2.3.4"}]}, "spec.decode.env[0].name",
     "spec.transfer.network.mode"),
    ({"spec.prefill.env": [{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "1"}]},
     "spec.prefill.env[0].name", "probes must not run a generation"),
])
def test_owned_flags_env_and_config_cannot_be_overridden(changes: dict[str, Any], path: str, words: str) -> None:
    report = validate(seed(**changes))
    assert [e.path for e in report.errors] == [path], report.errors
    assert "Forbidden" in report.errors[0].message and words in report.errors[0].message


@pytest.mark.parametrize(("env", "path", "words"), [
    # Each of these was admitted before, then refused by the API server at the Deployment's apply (found by the
    # full-size reliability fuzz: a boolean name, a 500 from server-side apply on every pass).
    ([{"name": False, "value": "1"}], "spec.decode.env[0].name", "quote it"),
    ([{"name": ["A"]}], "spec.decode.env[0].name", "other than '='"),
    ([{"name": "A", "value": {"x": 1}}], "spec.decode.env[0].value", "an env value is a string"),
    ([{"name": "A=B", "value": "1"}], "spec.decode.env[0].name", "other than '='"),
    ([{"value": "1"}], "spec.decode.env[0].name", "Required value"),
    ([{"name": "A", "value": 2}], "spec.decode.env[0].value", 'quote it ("2")'),
    ([{"name": "A", "valu": "2"}], "spec.decode.env[0].valu", "only name, value, valueFrom"),
    ([{"name": "A", "valueFrom": {}}], "spec.decode.env[0].valueFrom", "exactly one source"),
    ([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}, "secretKeyRef": {"name": "s", "key": "k"}}}],
     "spec.decode.env[0].valueFrom", "exactly one source"),
    ([{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
     "spec.decode.env[0].value", "exclusive"),
    ([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "spec.decode.env[1].name", "spec.decode.env[0]"),
    (["A=1"], "spec.decode.env[0]", "must be of type object"),
])
def test_env_entries_are_what_kubernetes_accepts(env: list[Any], path: str, words: str) -> None:
    report = validate(seed(**{"spec.decode.env": env}))
    assert [e.path for e in report.errors] == [path], report.errors
    assert words in report.errors[0].message, report.errors[0].message


def test_a_pools_env_entry_replaces_the_engine_wide_one_with_a_warning() -> None:
    from specserving.rendering import render
    from specserving.api.loading import spec_of

    obj = seed(**{"spec.engine.env": [{"name": "A", "value": "engine"}, {"name": "B", "value": "b"}],
                  "spec.decode.env": [{"name": "A", "value": "$(B)-decode"}]})
    report = validate(obj)
    assert not report.errors, report.errors
    assert [(w.path, "replaces spec.engine.env[0]" in w.message) for w in report.warnings
            if w.path.endswith("env[0].name")] == [("spec.decode.env[0].name", True)]
    envs = {m["metadata"]["labels"]["specserving.io/role"]: m["spec"]["template"]["spec"]["containers"][0]["env"]
            for m in render(spec_of(obj), obj["metadata"]) if m["kind"] == "Deployment"
            and m["metadata"]["labels"]["specserving.io/role"] in ("prefill", "decode")}
    assert [e for e in envs["decode"] if e["name"] in "AB"] == [{"name": "B", "value": "b"},
                                                               {"name": "A", "value": "$(B)-decode"}]
    assert [e for e in envs["prefill"] if e["name"] in "AB"] == [{"name": "A", "value": "engine"},
                                                                {"name": "B", "value": "b"}]


@pytest.mark.parametrize(("changes", "path", "words"), [
    ({"metadata.name": "1dsv4"}, "metadata.name", "DNS-1035"),
    ({"metadata.name": "dsv4.flash"}, "metadata.name", "DNS-1035"),
    ({"spec.engine.enableDpAttention": False}, "spec.engine.dp", "runs 8 copies of the model"),
    ({"spec.engine.enableDpAttention": False, "spec.engine.dp": 1, "spec.engine.enableDpLmHead": True}, None, ""),
    ({"spec.engine.memFractionStatic": "1"}, "spec.engine.memFractionStatic", "between 0 and 1"),
    ({"spec.engine.port": 8998}, "spec.prefill.bootstrapPort", "spec.engine.port uses the same port"),
    ({"spec.router.port": 29000}, "spec.router.port", "metrics on 29000"),
    ({"spec.model.path": "/data2/../etc/x"}, "spec.model.path", '".." is not allowed'),
    ({"spec.model.path": "/data2x/m"}, "spec.model.path", "must lie below spec.model.volume.mountPath"),
    ({"spec.model.volume.mountPath": "/dev/shm", "spec.model.path": "/dev/shm/m"}, "spec.model.volume.mountPath",
     "mounts /dev/shm itself"),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.15-cu129", "spec.image.build": {"policy": "IfNeeded"}},
     "spec.engine.enableDpAttention", "whatever the --moe-a2a-backend"),
])
def test_startup_ports_names_and_paths(changes: dict[str, Any], path: str | None, words: str) -> None:
    report = validate(seed(**changes))
    if path is None:
        assert report.ok, report.errors
        return
    found = [e for e in report.errors if e.path == path]
    assert found and words in found[0].message, report.errors
    assert ": use one of \n" not in str(report.errors) and not str(report.errors).endswith("use one of ")


def test_an_ib_device_item_names_one_device() -> None:
    report = validate(seed(**{"spec.transfer.ibDevices": ["mlx5_0,mlx5_1"] * 8}))
    assert report.errors and {e.path for e in report.errors} == {f"spec.transfer.ibDevices[{i}]" for i in range(8)}


def test_env_type_errors_advise_quoting_only_scalars() -> None:
    report = validate(seed(**{"spec.decode.env": [{"name": ["A"], "value": {"x": 1}}, {"name": True, "value": 7}]}))
    advice = {e.path: "quote it" in e.message for e in report.errors}
    assert advice == {"spec.decode.env[0].name": False, "spec.decode.env[0].value": False,
                      "spec.decode.env[1].name": True, "spec.decode.env[1].value": True}, report.errors
