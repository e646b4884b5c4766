"""Property tests: every valid spec renders, and every pool pod asks for what its engine settings imply."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specserving.admission import review
from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.rendering import render
from specserving.validation import validate

TABLE = load()


@st.composite
def specservings(draw: st.DrawFn) -> dict[str, Any]:
    version = draw(st.sampled_from(sorted(TABLE.versions)))
    policy = draw(st.sampled_from(["IfNeeded", "Never"]))
    algorithm = draw(st.sampled_from(sorted(TABLE.versions[version].builders(policy == "IfNeeded"))))
    nodes = draw(st.sampled_from([1, 1, 1, 2, 4]))
    gpus_per_pod = draw(st.sampled_from([1, 2, 4, 8]))
    tp = gpus_per_pod * nodes
    # SGLang runs DFLASH under DP attention from 0.5.23 on (validation.DFLASH_DP_ATTENTION_FROM).
    dp_attention = draw(st.booleans()) and (algorithm != "DFLASH" or version == "0.5.23")
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32) if tp % d == 0])) if dp_attention else 1
    backend = draw(st.sampled_from(["mooncake", "mooncake_tcp", "nixl"]))
    transfer: dict[str, Any] = {"backend": backend}
    if backend != "mooncake_tcp" and draw(st.booleans()):
        transfer["ibDevices"] = [f"mlx5_{i}" for i in range(gpus_per_pod)]
    if draw(st.booleans()):
        transfer["rdma"] = {"resourceName": "rdma/hca_shared_devices_a", "count": draw(st.integers(1, 8))}
    if draw(st.booleans()):
        transfer["network"] = {"mode": "Multus", "multusNetworks": ["ib-net"]}
    pool = {"nodesPerReplica": nodes, "replicas": draw(st.integers(0, 5))}
    return {
        "apiVersion": "specserving.io/v1alpha1",
        "kind": "SpecServing",
        "metadata": {"name": draw(st.from_regex(r"[a-z][a-z0-9]{0,20}", fullmatch=True)), "namespace": "ns",
                     "uid": "u-1"},
        "spec": {
            "model": {"path": "/m/model"},
            "image": {"base": f"lmsysorg/sglang:v{version}-cu129", "build": {"policy": policy}},
            "engine": {"tp": tp, "dp": dp, "enableDpAttention": dp_attention,
                       "enableDpLmHead": dp_attention},
            "speculative": {"algorithm": algorithm, **({"draftModelPath": "/m/draft"} if algorithm == "DFLASH"
                                                       else {})},
            "prefill": {**pool, "speculativeDecoding": draw(st.sampled_from(["Enabled", "Disabled"]))},
            "decode": {**pool, "cudaGraphBatchSizes": draw(st.lists(st.integers(1, 256), max_size=6))},
            "transfer": transfer,
        },
    }


def _pod_specs(children: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for c in children:
        role = c["metadata"]["labels"]["specserving.io/role"]
        if c["kind"] == "Deployment" and role != "router":
            out.append((role, c["spec"]["template"]))
        if c["kind"] == "LeaderWorkerSet":
            tmpl = c["spec"]["leaderWorkerTemplate"]
            out += [(role, tmpl["leaderTemplate"]), (role, tmpl["workerTemplate"])]
    return out


@settings(max_examples=150, deadline=None)
@given(specservings())
def test_every_valid_spec_renders_pods_that_ask_for_their_gpus_and_rdma(obj: dict[str, Any]) -> None:
    report = validate(obj)
    assert report.ok, report.summary()
    children = render(spec_of(obj), obj["metadata"])
    spec = obj["spec"]
    tp, nodes = spec["engine"]["tp"], spec["prefill"]["nodesPerReplica"]
    pods = _pod_specs(children)
    assert {r for r, _ in pods} == {"prefill", "decode"}
    for role, tmpl in pods:
        (container,) = tmpl["spec"]["containers"]
        limits = container["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(tp // nodes)
        rdma = spec["transfer"].get("rdma", {})
        rdma_name = rdma.get("resourceName", "rdma/ib")
        if spec["transfer"]["backend"] == "mooncake_tcp":
            assert rdma_name not in limits
            # IPC_LOCK only where RDMA pins memory
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        else:
            assert limits[rdma_name] == str(rdma.get("count", tp // nodes))
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert container["resources"]["requests"] == limits
        assert container["securityContext"]["privileged"] is False
        # One user for base and built images alike (the image's USER never decides it).
        assert tmpl["spec"]["securityContext"] == {"runAsUser": 0, "runAsGroup": 0,
                                                   "seccompProfile": {"type": "RuntimeDefault"}}
        args = container["args"]
        assert args[args.index("--tp-size") + 1] == str(tp)
        assert args[args.index("--disaggregation-mode") + 1] == role
        if role == "prefill":
            assert tmpl["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"
    for c in children:
        assert c["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert len(c["metadata"]["name"]) <= 63


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-5, 100) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["tp", "dp", "algorithm", "backend", "ibDevices", "replicas", "x"]),
                        inner, max_size=3), max_leaves=8))
def test_arbitrary_engine_input_is_refused_with_paths_never_an_exception(junk: Any) -> None:
    obj = {"apiVersion": "specserving.io/v1alpha1", "kind": "SpecServing", "metadata": {"name": "a"},
           "spec": {"model": {"path": "/m"}, "image": {"base": "lmsysorg/sglang:v0.5.23"}, "engine": junk,
                    "transfer": junk}}
    report = validate(obj)
    for e in report.errors:
        assert e.path.startswith("spec."), e


@settings(max_examples=200, deadline=None)
@given(specservings())
def test_the_webhook_skipping_the_schema_decides_as_the_full_check_does(obj: dict[str, Any]) -> None:
    # Every object the apiserver's schema admits: review() leaves the schema to it and must decide the same.
    assert not validate(obj, run_cel=False).malformed
    fast, full = review(obj, None), validate(obj, run_cel=False)
    assert (fast.errors, fast.warnings) == (full.errors, full.warnings)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-5, 100) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["tp", "dp", "algorithm", "backend", "ibDevices", "path"]),
                        inner, max_size=3), max_leaves=8))
def test_the_webhook_given_a_shape_the_schema_would_refuse_answers_and_never_raises(junk: Any) -> None:
    obj = {"apiVersion": "specserving.io/v1alpha1", "kind": "SpecServing", "metadata": {"name": "a"},
           "spec": {"model": junk, "image": {"base": "lmsysorg/sglang:v0.5.23"}, "engine": junk, "transfer": junk}}
    review(obj, None)


ALL_ENGINE_FIELDS = {"memFractionStatic": "0.8", "maxRunningRequests": 64, "chunkedPrefillSize": 4096,
                     "toolCallParser": "deepseekv3", "reasoningParser": "deepseek-r1",
                     "disableFlashinferAutotune": True, "moeRunnerBackend": "flashinfer_trtllm",
                     "metrics": {"enabled": True, "cacheReport": True},
                     "requestLogging": {"enabled": True, "level": 1}}


@settings(max_examples=100, deadline=None)
@given(specservings(), st.booleans())
def test_every_flag_and_env_the_operator_renders_is_owned(obj: dict[str, Any], every_field: bool) -> None:
    """One table: what rendering emits from typed fields is exactly what extraArgs and env may not set, so the
    guard cannot drift from the renderer (a flag rendered but not owned could be overridden after validation)."""
    from specserving.rendering.args import OWNED_FLAGS, flag_name
    from specserving.rendering.pods import OWNED_ENV

    if every_field:
        obj["spec"]["engine"].update(ALL_ENGINE_FIELDS)
        obj["spec"]["model"]["servedModelName"] = "m"
        obj["spec"]["model"]["trustRemoteCode"] = True
    report = validate(obj)
    assume(report.ok)
    assert report.spec is not None
    for _, template in _pod_specs(render(report.spec, obj["metadata"])):
        (container,) = template["spec"]["containers"]
        flags = {f for token in container["args"] if (f := flag_name(token))}
        assert flags <= set(OWNED_FLAGS), flags - set(OWNED_FLAGS)
        names = {e["name"] for e in container["env"]}
        assert names <= set(OWNED_ENV), names - set(OWNED_ENV)


@settings(max_examples=150, deadline=None)
@given(specservings(), st.booleans(), st.sampled_from([None, "sglang-router", "smg"]))
def test_every_rendered_command_line_parses_with_its_versions_rules(obj: dict[str, Any], every_field: bool,
                                                                   router_implementation: str | None) -> None:
    """Every container argv the renderer writes for an admitted spec is read without an error by the generated
    parser rules of its program: the SGLang version of the image for the pools, the chosen router's for the router."""
    from specserving import argv
    from specserving.command_lines import check_command_lines
    from specserving.rendering.router import LAUNCHERS

    if every_field:
        obj["spec"]["engine"].update(ALL_ENGINE_FIELDS)
        obj["spec"]["model"]["servedModelName"] = "m"
        obj["spec"]["model"]["trustRemoteCode"] = True
    if router_implementation:
        obj["spec"]["router"] = {"implementation": router_implementation}
    report = validate(obj)
    if report.spec is not None:
        # Typed fields the strategy draws are valid on every version: none may be refused for its command line
        # (else a renderer bug would hide behind assume).
        assert not check_command_lines(report.spec).errors, check_command_lines(report.spec).errors
    assume(report.ok)
    assert report.spec is not None
    children = render(report.spec, obj["metadata"])
    version = obj["spec"]["image"]["base"].split(":v")[1].split("-")[0]
    for role, template in _pod_specs(children):
        (container,) = template["spec"]["containers"]
        parsed = argv.parse(argv.tokens(container["args"], role), argv.sglang(version))
        assert not parsed.errors, (role, [e.message for e in parsed.errors])
    (router,) = [c for c in children if c["kind"] == "Deployment" and c["metadata"]["labels"]["specserving.io/role"]
                 == "router"]
    container = router["spec"]["template"]["spec"]["containers"][0]
    implementation = next(name for name, launcher in LAUNCHERS.items() if launcher == container["command"])
    grammar = argv.router(implementation)
    assert grammar is not None
    parsed = argv.parse(argv.tokens(container["args"], "router"), grammar)
    assert not parsed.errors, [e.message for e in parsed.errors]
