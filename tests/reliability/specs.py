"""Hypothesis strategies for SpecServing objects: valid ones across the API, and invalid ones made from a valid one
by one to three mutations (wrong types, bounds, enums, unknown and missing fields, patterns, cross-field rules,
the operator's own rules, bad names, free-form Kubernetes fragments).

The strategies aim at both sides; `specserving.validation.validate` decides which side an object is on.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from hypothesis import strategies as st
from specserving.api.naming import MAX_NAME_LENGTH
from specserving.capabilities import load
from specserving.rendering.args import OWNED_FLAGS

TABLE = load()
VERSIONS = sorted(TABLE.versions)
_names = itertools.count()


def unique_name(prefix: str = "fz") -> str:
    return f"{prefix}-{next(_names)}"


def _dfs(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) below `obj`, dicts and lists included."""
    out = [(path, obj)] if path else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _dfs(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _dfs(v, (*path, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    """Set obj[path] = value, making (or replacing with) dicts on the way where an earlier mutation left none."""
    node = obj
    for p, nxt in zip(path[:-1], path[1:], strict=True):
        if isinstance(node, list):
            node = node[p]
            continue
        child = node.get(p)
        if not isinstance(child, (dict, list)) or (isinstance(child, list) and not isinstance(nxt, int)):
            child = node[p] = {}
        node = child
    node[path[-1]] = value


def _delete(obj: Any, path: tuple[Any, ...]) -> None:
    node = obj
    for p in path[:-1]:
        if not isinstance(node, dict) or p not in node:
            return
        node = node[p]
    if isinstance(node, dict):
        node.pop(path[-1], None)


@st.composite
def valid_specs(draw: st.DrawFn, prefix: str = "fz") -> dict[str, Any]:
    """A SpecServing meant to be admitted: versions, algorithms, topologies, transfers, volumes, options."""
    version = draw(st.sampled_from(VERSIONS))
    caps = TABLE.versions[version]
    # Mostly algorithms the base image serves (no build), sometimes one only the fixed image serves.
    if caps.needs_fix and draw(st.integers(0, 4)) == 0:
        policy, algorithm = "IfNeeded", draw(st.sampled_from(sorted(caps.needs_fix)))
    else:
        policy = draw(st.sampled_from(["IfNeeded", "Never"]))
        algorithm = draw(st.sampled_from(sorted(caps.upstream)))
    nodes = draw(st.sampled_from([1, 1, 1, 1, 2]))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    tp = gpus * nodes
    dp_attention = draw(st.booleans()) and (algorithm != "DFLASH" or version == "0.5.23")
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if tp % d == 0])) if dp_attention else 1
    engine: dict[str, Any] = {"tp": tp, "dp": dp, "enableDpAttention": dp_attention,
                              "enableDpLmHead": dp_attention}
    if draw(st.booleans()):
        engine["memFractionStatic"] = draw(st.sampled_from(["0.8", ".85", "0.9", "0.95"]))
    if draw(st.booleans()):
        engine["maxRunningRequests"] = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        engine["chunkedPrefillSize"] = draw(st.sampled_from([-1, 8192, 65536]))
    if draw(st.booleans()):
        engine["extraArgs"] = draw(st.sampled_from([["--log-level", "info"], ["--watchdog-timeout=600"], []]))
    if draw(st.booleans()):
        engine["env"] = [{"name": "FUZZ_ENV", "value": draw(st.sampled_from(["1", "on", ""]))}]
    if draw(st.booleans()):
        engine["metrics"] = {"enabled": draw(st.booleans()), "cacheReport": draw(st.booleans())}
    if draw(st.booleans()):
        engine["port"] = draw(st.integers(1024, 65535).filter(lambda p: p not in (8998, 20000)))
    speculative: dict[str, Any] = {"algorithm": algorithm}
    if algorithm in ("DFLASH", "EAGLE", "EAGLE3") or draw(st.booleans()):
        speculative["draftModelPath"] = "/models/m/draft"
    if draw(st.booleans()):
        steps = draw(st.integers(1, 8))
        speculative.update({"numSteps": steps, "numDraftTokens": steps + 1})
        if algorithm == "DFLASH" and draw(st.booleans()):
            speculative["blockSize"] = steps + 1
        if algorithm == "DSPARK" and draw(st.booleans()):
            speculative["blockSize"] = steps  # DSPARK verifies blockSize + 1 tokens
        if algorithm in ("EAGLE", "EAGLE3") and draw(st.integers(0, 3)):
            speculative["eagleTopk"] = draw(st.sampled_from([1, 1, 2]))
    backend = draw(st.sampled_from(["mooncake", "mooncake_tcp", "nixl"]))
    transfer: dict[str, Any] = {"backend": backend}
    if backend != "mooncake_tcp" and draw(st.booleans()):
        transfer["ibDevices"] = [f"mlx5_{i}" for i in range(gpus)]
    if draw(st.booleans()):
        transfer["rdma"] = {"resourceName": "rdma/hca_shared_devices_a", "count": draw(st.integers(1, 8))}
    if draw(st.booleans()):
        transfer["network"] = {"mode": "Multus", "multusNetworks": ["ib-net"]}
    model: dict[str, Any] = {"path": "/models/m/weights"}
    volume = draw(st.sampled_from([None, "pvc", "hostPath", "nfs"]))
    if volume == "pvc":
        model["volume"] = {"mountPath": "/models", "persistentVolumeClaim": {"claimName": "weights"}}
    elif volume == "hostPath":
        model["volume"] = {"mountPath": "/models", "hostPath": {"path": "/data2"}}
    elif volume == "nfs":
        model["volume"] = {"mountPath": "/models/m", "nfs": {"server": "nfs.example.com", "path": "/export"}}
    image: dict[str, Any] = {"base": f"lmsysorg/sglang:v{version}-cu129", "build": {"policy": policy}}
    if draw(st.booleans()):
        image["pullSecrets"] = [{"name": "regcred"}]
    if draw(st.booleans()):
        image["pullPolicy"] = draw(st.sampled_from(["Always", "IfNotPresent", "Never"]))
    # Few pods: the cluster has eight fake nodes and many examples.
    replicas = st.sampled_from([0, 0, 0, 1])
    router = {"replicas": draw(st.sampled_from([0, 1])),
              "policy": draw(st.sampled_from(["cache_aware", "round_robin", "random", "power_of_two"]))}
    return {
        "apiVersion": "specserving.io/v1alpha1",
        "kind": "SpecServing",
        "metadata": {"name": unique_name(prefix)},
        "spec": {
            "model": model,
            "image": image,
            "engine": engine,
            "speculative": speculative,
            "prefill": {"replicas": draw(replicas), "nodesPerReplica": nodes,
                        "speculativeDecoding": draw(st.sampled_from(["Enabled", "Enabled", "Disabled"]))},
            "decode": {"replicas": draw(replicas), "nodesPerReplica": nodes,
                       "cudaGraphBatchSizes": draw(st.lists(st.integers(1, 256), max_size=6))},
            "transfer": transfer,
            "router": router,
        },
    }


# -- mutations: each takes a draw function and a valid object, changes it in place, returns what it did -----------

def _wrong_type(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    leaves = [(p, v) for p, v in _dfs(obj["spec"], ("spec",))]
    path, value = draw(st.sampled_from(leaves))
    if isinstance(value, bool):
        new: Any = draw(st.sampled_from(["yes", 1, [True]]))
    elif isinstance(value, int):
        new = draw(st.sampled_from(["8", 8.5, True, None, {"n": 8}]))
    elif isinstance(value, str):
        new = draw(st.sampled_from([8, False, ["x"], {"x": "y"}]))
    elif isinstance(value, list):
        new = draw(st.sampled_from(["a,b", {"a": 1}, 3]))
    else:
        new = draw(st.sampled_from(["x", 1, [1]]))
    _set(obj, path, new)
    return f"type {'.'.join(map(str, path))}={new!r}"


INT_BOUNDS = {
    ("spec", "engine", "tp"): (0, 65), ("spec", "engine", "dp"): (0, 65), ("spec", "engine", "port"): (80, 70000),
    ("spec", "engine", "maxRunningRequests"): (0, 1_000_001), ("spec", "engine", "chunkedPrefillSize"): (-2, None),
    ("spec", "prefill", "replicas"): (-1, 1001), ("spec", "decode", "replicas"): (-1, 1001),
    ("spec", "prefill", "nodesPerReplica"): (0, 17), ("spec", "decode", "gpusPerNode"): (0, 17),
    ("spec", "prefill", "bootstrapPort"): (1023, 65536), ("spec", "router", "replicas"): (-1, 101),
    ("spec", "router", "port"): (0, 65536), ("spec", "speculative", "numSteps"): (0, 65),
    ("spec", "speculative", "numDraftTokens"): (0, 1025), ("spec", "transfer", "rdma", "count"): (0, 65),
    ("spec", "decode", "startupTimeoutSeconds"): (59, 86401),
    ("spec", "prefill", "terminationGracePeriodSeconds"): (-1, 86401),
    ("spec", "engine", "requestLogging", "level"): (-1, 4),
}


def _out_of_range(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    path = draw(st.sampled_from(sorted(INT_BOUNDS)))
    low, high = INT_BOUNDS[path]
    value = draw(st.sampled_from([v for v in (low, high) if v is not None]))
    _set(obj, path, value)
    return f"range {'.'.join(path)}={value}"


ENUMS = [("spec", "speculative", "algorithm"), ("spec", "transfer", "backend"),
         ("spec", "transfer", "network", "mode"), ("spec", "image", "pullPolicy"),
         ("spec", "image", "build", "policy"), ("spec", "router", "policy"), ("spec", "router", "serviceType"),
         ("spec", "prefill", "speculativeDecoding"), ("spec", "router", "decodePolicy")]


def _bad_enum(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    path = draw(st.sampled_from(ENUMS))
    value = draw(st.sampled_from(["", "dspark", "MEDUSA", "rdma", "Sometimes", "least_loaded", "Bridge",
                                  "x" * 70]))
    _set(obj, path, value)
    return f"enum {'.'.join(path)}={value!r}"


def _unknown_field(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    where = draw(st.sampled_from([("spec",), ("spec", "engine"), ("spec", "prefill"), ("spec", "transfer"),
                                  ("spec", "speculative"), ("spec", "router"), ("spec", "image", "build")]))
    key = draw(st.sampled_from(["replicaCount", "tensorParallel", "bogus", "speculativeAlgorithm", "gpu"]))
    _set(obj, (*where, key), draw(st.sampled_from([1, "x", True])))
    return f"unknown {'.'.join(where)}.{key}"


def _missing_required(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    choices = [("spec", "model"), ("spec", "model", "path"), ("spec", "image"), ("spec", "image", "base"),
               ("spec",)]
    if obj["spec"]["model"].get("volume"):
        choices.append(("spec", "model", "volume", "mountPath"))
    path = draw(st.sampled_from(choices))
    _delete(obj, path)
    return f"missing {'.'.join(path)}"


PATTERNS = [
    (("spec", "image", "base"), "lmsysorg/sglang: v0.5.17"), (("spec", "engine", "memFractionStatic"), "1.5"),
    (("spec", "engine", "memFractionStatic"), "80%"), (("spec", "engine", "moeA2aBackend"), "deep ep"),
    (("spec", "transfer", "rdma", "resourceName"), "rdma"), (("spec", "image", "build", "registry"), "Registry/X"),
    (("spec", "image", "sglangVersion"), "v0.5"), (("spec", "model", "path"), "x" * 4097),
    (("spec", "image", "pullSecrets"), [{"name": "Bad_Name"}]), (("spec", "engine", "toolCallParser"), "a;b"),
    (("spec", "decode", "cudaGraphBatchSizes"), [0, 8]), (("spec", "engine", "extraArgs"), ["x" * 1025]),
]


def _pattern(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    path, value = draw(st.sampled_from(PATTERNS))
    _set(obj, path, copy.deepcopy(value))
    return f"pattern {'.'.join(path)}"


def _cross_field(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    spec = obj["spec"]
    case = draw(st.sampled_from(["dp", "ib-count", "ib-tcp", "multus-empty", "multus-host", "dflash-draft",
                                 "block-size", "model-path", "two-sources", "nodes-split", "gpus-per-node"]))
    if case == "dp":
        spec["engine"].update({"tp": 8, "dp": 3, "enableDpAttention": True})
    elif case == "ib-count":
        spec["transfer"]["ibDevices"] = ["mlx5_0"] * (spec["engine"]["tp"] // spec["decode"]["nodesPerReplica"] + 1)
    elif case == "ib-tcp":
        spec["transfer"].update({"backend": "mooncake_tcp", "ibDevices": ["mlx5_0"]})
    elif case == "multus-empty":
        spec["transfer"]["network"] = {"mode": "Multus"}
    elif case == "multus-host":
        spec["transfer"]["network"] = {"mode": "HostNetwork", "multusNetworks": ["ib-net"]}
    elif case == "dflash-draft":
        spec["speculative"] = {"algorithm": "DFLASH"}
    elif case == "block-size":
        spec["speculative"].update({"algorithm": "EAGLE", "blockSize": 4, "draftModelPath": "/d"})
    elif case == "model-path":
        spec["model"] = {"path": "/elsewhere/m", "volume": {"mountPath": "/models", "hostPath": {"path": "/d"}}}
    elif case == "two-sources":
        spec["model"] = {"path": "/models/m", "volume": {"mountPath": "/models", "hostPath": {"path": "/d"},
                                                         "nfs": {"server": "s", "path": "/e"}}}
    elif case == "nodes-split":
        spec["engine"].update({"tp": 8, "dp": 1, "enableDpAttention": False})
        spec["prefill"]["nodesPerReplica"] = 3
        spec["transfer"].pop("ibDevices", None)
    else:
        spec["engine"].update({"tp": 16, "dp": 1, "enableDpAttention": False})
        spec["decode"]["nodesPerReplica"] = 1
        spec["transfer"].pop("ibDevices", None)
    return f"cel {case}"


def _operator_rule(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    spec = obj["spec"]
    case = draw(st.sampled_from(["no-builder", "dflash-dp", "owned-flag", "role-switch", "lm-head", "a2a",
                                 "unknown-flag", "pp-size", "owned-env"]))
    if case == "no-builder":
        spec["speculative"]["algorithm"] = draw(st.sampled_from(["NGRAM", "STANDALONE", "UNO"]))
        spec["speculative"].pop("blockSize", None)
    elif case == "dflash-dp":
        spec["image"]["base"] = "lmsysorg/sglang:v0.5.21-cu129"
        spec["engine"].update({"tp": 8, "dp": 8, "enableDpAttention": True})
        spec["speculative"] = {"algorithm": "DFLASH", "draftModelPath": "/d"}
        spec["prefill"]["nodesPerReplica"] = spec["decode"]["nodesPerReplica"] = 1
        spec["transfer"].pop("ibDevices", None)
    elif case == "owned-flag":
        flag = draw(st.sampled_from(sorted(OWNED_FLAGS)))
        pool = draw(st.sampled_from(["engine", "prefill", "decode"]))
        spec[pool]["extraArgs"] = draw(st.sampled_from([[flag, "1"], [f"{flag}=1"]]))
    elif case == "role-switch":
        spec["decode"]["extraArgs"] = ["--enable-pd-role-switch"]
    elif case == "unknown-flag":
        spec[draw(st.sampled_from(["engine", "prefill", "decode"]))]["extraArgs"] = ["--no-such-flag"]
    elif case == "pp-size":
        spec["decode"]["extraArgs"] = ["--pp-size", "2"]
    elif case == "owned-env":
        name = draw(st.sampled_from(["SGLANG_HOST_IP", "SGLANG_RAGGED_VERIFY_MODE"]))
        spec[draw(st.sampled_from(["engine", "decode"]))]["env"] = [{"name": name, "value": "x"}]
    elif case == "lm-head":
        spec["image"]["base"] = "lmsysorg/sglang:v0.5.17-cu129"
        spec["engine"].update({"tp": 8, "dp": 8, "enableDpAttention": True, "enableDpLmHead": False})
        spec["speculative"] = {"algorithm": "DSPARK"}
        spec["prefill"]["nodesPerReplica"] = spec["decode"]["nodesPerReplica"] = 1
        spec["transfer"].pop("ibDevices", None)
    else:
        spec["image"]["base"] = "lmsysorg/sglang:v0.5.17-cu129"
        spec["engine"].update({"tp": 8, "dp": 8, "enableDpAttention": True, "moeA2aBackend": "deepep"})
        spec["speculative"] = {"algorithm": "DSPARK"}
        spec["prefill"]["nodesPerReplica"] = spec["decode"]["nodesPerReplica"] = 1
        spec["transfer"].pop("ibDevices", None)
    return f"rule {case}"


def _bad_name(draw: st.DrawFn, obj: dict[str, Any]) -> str:
    base = obj["metadata"]["name"]
    obj["metadata"]["name"] = draw(st.sampled_from([
        f"{base}-" + "n" * MAX_NAME_LENGTH, f"{base}-" + "n" * (MAX_NAME_LENGTH - len(base))]))
    return f"name length {len(obj['metadata']['name'])} (max {MAX_NAME_LENGTH})"


MUTATIONS = [_wrong_type, _out_of_range, _bad_enum, _unknown_field, _missing_required, _pattern, _cross_field,
             _operator_rule, _bad_name]


@st.composite
def mutated_specs(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """A valid SpecServing broken by one to three mutations, and what they were."""
    obj = copy.deepcopy(draw(valid_specs()))
    done = []
    for mutate in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        try:
            done.append(mutate(draw, obj))
        except (KeyError, TypeError, AttributeError, IndexError):
            done.append(f"{mutate.__name__} (not applicable after {done})")  # an earlier mutation removed its target
    return obj, done


@st.composite
def operator_invalid_specs(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """A valid SpecServing broken by one or two of the operator's own rules only: the CRD's schema admits it, so
    with the webhook off it is stored and reaches the reconciler."""
    obj = copy.deepcopy(draw(valid_specs()))
    return obj, [_operator_rule(draw, obj) for _ in range(draw(st.integers(1, 2)))]
