"""The router per implementation and version, DP-aware registration, and the probes and env per SGLang version."""

from __future__ import annotations

from typing import Any

import pytest

from specserving.api.loading import spec_of
from specserving.rendering import render

from .builders import seed


def _by_role(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["labels"]["specserving.io/role"]: m for m in render(spec_of(obj), obj["metadata"])
            if m["kind"] == "Deployment"}


def _container(obj: dict[str, Any], role: str) -> dict[str, Any]:
    container: dict[str, Any] = _by_role(obj)[role]["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(("changes", "module"), [
    ({}, "sglang_router.launch_router"),  # 0.5.17's image carries sglang-router (the capability table)
    ({"spec.router.implementation": "smg"}, "smg.launch_router"),
    ({"spec.image.sglangVersion": "0.6.0"}, "sglang_router.launch_router"),  # unknown: the default, warned about
], ids=["recorded-for-the-version", "chosen", "unknown-version"])
def test_the_router_command_follows_the_implementation(changes: dict[str, Any], module: str) -> None:
    assert _container(seed(**changes), "router")["command"] == ["python3", "-m", module]


SMG = {"spec.router.implementation": "smg"}
PLAIN_TP = {"spec.engine.enableDpAttention": False, "spec.engine.dp": 1, "spec.engine.enableDpLmHead": False}


@pytest.mark.parametrize(("changes", "dp_aware"), [
    (SMG, True),  # DP attention over 8 ranks, on the router that routes ranks
    ({}, False),  # sglang-router 0.3.2 misroutes DP-aware PD requests: not by default
    ({**SMG, "spec.router.dpAware": False}, False),
    ({**SMG, **PLAIN_TP}, False),
    ({**SMG, **PLAIN_TP, "spec.router.dpAware": True}, True),
], ids=["smg-dp-attention", "sglang-router-dp-attention", "switched-off", "plain-tp", "forced-on"])
def test_dp_aware_by_default_under_dp_attention_on_smg(changes: dict[str, Any], dp_aware: bool) -> None:
    assert ("--dp-aware" in _container(seed(**changes), "router")["args"]) is dp_aware


def test_only_smg_is_told_not_to_load_a_tokenizer() -> None:
    # smg would fetch the tokenizer from the model path, which only the engine pods mount (docs/router.md).
    assert "--disable-tokenizer-autoload" in _container(seed(**SMG), "router")["args"]
    assert "--disable-tokenizer-autoload" not in _container(seed(), "router")["args"]


def test_router_placement() -> None:
    tolerations = [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}]
    pod = _by_role(seed(**{"spec.router.nodeSelector": {"pool": "cpu"}, "spec.router.tolerations": tolerations}))[
        "router"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["tolerations"] == tolerations


@pytest.mark.parametrize(("version", "path"), [("0.5.17", "/health"), ("0.5.19", "/health"), ("0.5.20", "/ready"),
                                               ("0.6.0", "/health")])
def test_probes_use_ready_where_the_version_has_it(version: str, path: str) -> None:
    obj = seed(**{"spec.image.sglangVersion": version})
    for role in ("prefill", "decode"):
        c = _container(obj, role)
        assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {path}
        # /health must never run a generation: a decode pod cannot generate without a prefill peer.
        assert {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "0"} in c["env"]


@pytest.mark.parametrize(("version", "backend", "expected"), [
    ("0.5.20", "nixl", "60"), ("0.5.19", "nixl", None), ("0.5.20", "mooncake", None)])
def test_engine_init_timeout_only_where_sglang_reads_it(version: str, backend: str, expected: str | None) -> None:
    obj = seed(**{"spec.image.sglangVersion": version, "spec.transfer.backend": backend})
    env = {e["name"]: e.get("value") for e in _container(obj, "decode")["env"]}
    assert env.get("SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT") == expected


def test_engine_init_timeout_stays_below_a_short_startup_budget() -> None:
    obj = seed(**{"spec.image.sglangVersion": "0.5.20", "spec.transfer.backend": "nixl",
                  "spec.decode.startupTimeoutSeconds": 60})
    env = {e["name"]: e.get("value") for e in _container(obj, "decode")["env"]}
    assert int(env["SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT"]) < 60
