"""Every flag the renderer writes is accepted by the real parsers: each example's prefill and decode containers
by the `ServerArgs` parser of the SGLang release its image carries; the router's, for every SGLang version and
both router implementations, by the parser of the implementation the rendered command runs (sglang-router, smg)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import ROOT, VERSIONS, Run, Runner, router_dir, router_pins, router_run, runs_for, script_run
from .server_args_check import expand

pytestmark = pytest.mark.decode_path

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SERVER_MODULES = ("sglang.launch_server", "sglang.srt.server", "sglang")


def _containers(example: Path) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(role, sglang version, container) for the SGLang and router containers the example renders."""
    from specserving.rendering import render
    from specserving.rendering.image import base_image
    from specserving.api.loading import spec_of

    found = []
    for obj in yaml.safe_load_all(example.read_text()):
        if not obj:
            continue
        version = base_image(spec_of(obj)).sglang_version
        for manifest in render(spec_of(obj), obj["metadata"]):
            role = manifest["metadata"].get("labels", {}).get("specserving.io/role")
            if manifest["kind"] not in ("Deployment", "LeaderWorkerSet") or role not in ("prefill", "decode", "router"):
                continue
            if manifest["kind"] == "Deployment":
                templates = [manifest["spec"]["template"]]
            else:  # a pool spanning nodes: the leader's and the workers' pods
                group = manifest["spec"]["leaderWorkerTemplate"]
                templates = [t for t in (group.get("leaderTemplate"), group["workerTemplate"]) if t]
            for template in templates:
                for container in template["spec"]["containers"]:
                    found.append((role, version, container))
    return found


PARSE_SERVER = r"""
import argparse, contextlib, io, json
from sglang.srt.server_args import ServerArgs
results = []
for args in ARGS:
    parser = argparse.ArgumentParser(prog="sglang", add_help=False, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
        results.append(None)
    except SystemExit:
        results.append(err.getvalue().strip().splitlines()[-1])
print(json.dumps(results))
"""

PARSE_ROUTER = r"""
import contextlib, importlib, io, json
results = []
for module, args in CASES:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            importlib.import_module(module).parse_router_args(args)
        results.append(None)
    except SystemExit:
        results.append(err.getvalue().strip())
print(json.dumps(results))
"""


def test_examples_exist() -> None:
    assert EXAMPLES, "no examples/*.yaml to check"


def _server_runs(example: Path) -> list[tuple[str, list[str], Run]]:
    """(version, roles, run) per SGLang release the example's prefill and decode images carry."""
    by_version: dict[str, list[tuple[str, list[str]]]] = {}
    for role, version, container in _containers(example):
        if role in ("prefill", "decode"):
            # A multi-node pod's $(LWS_...) references, expanded as the kubelet would (stand-in values).
            args = expand(container["args"], {e["name"]: e["value"] for e in container.get("env", [])
                                              if isinstance(e.get("value"), str)})
            by_version.setdefault(str(version), []).append((role, args))
    return [
        (version, [role for role, _ in items],
         script_run(version, PARSE_SERVER.replace("ARGS", json.dumps([args for _, args in items]))))
        for version, items in by_version.items()
    ]


def _router_cases() -> list[tuple[str, str, list[str]]]:
    """(label, module, args): each example's router as rendered, and the seed example's router for every SGLang
    version of the tier under each implementation (the module is the one the rendered command runs)."""
    from specserving.api.loading import spec_of
    from specserving.rendering import render
    from specserving.rendering.router import LAUNCHERS

    objs = []
    for example in EXAMPLES:
        objs += [(example.stem, obj) for obj in yaml.safe_load_all(example.read_text()) if obj]
    seed = next(obj for stem, obj in objs if stem == "dspark-pd-tp8dp8")
    for version in VERSIONS:
        for implementation in LAUNCHERS:
            obj = copy.deepcopy(seed)
            obj["spec"]["image"]["base"] = f"lmsysorg/sglang:v{version}-cu129"
            obj["spec"]["router"] = {**obj["spec"].get("router", {}), "implementation": implementation}
            objs.append((f"seed on {version} with {implementation}", obj))
    cases = []
    for label, obj in objs:
        for manifest in render(spec_of(obj), obj["metadata"]):
            if manifest["kind"] == "Deployment" and manifest["metadata"]["labels"].get("specserving.io/role") == "router":
                container = manifest["spec"]["template"]["spec"]["containers"][0]
                command = container["command"]
                assert command[:2] == ["python3", "-m"], command
                cases.append((label, command[2], container["args"]))
    return cases


def _router_run() -> Run:
    return router_run(PARSE_ROUTER.replace("CASES", json.dumps([[m, a] for _, m, a in _router_cases()])))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@runs_for(lambda example: [run for version, _, run in _server_runs(example) if version in VERSIONS])
def test_server_flags_accepted(runner: Runner, example: Path) -> None:
    servers = [(role, c) for role, _, c in _containers(example) if role in ("prefill", "decode")]
    assert {role for role, _ in servers} == {"prefill", "decode"}, example.name
    for _, container in servers:
        command = container.get("command") or []
        assert any(part in SERVER_MODULES or part == "serve" for part in command), command
    for version, roles, run in _server_runs(example):
        assert version in VERSIONS, f"{example.name}: the image's SGLang version {version!r} is not in the decode_path tier"
        rejected = {role: err for role, err in zip(roles, runner.json(run)) if err}
        # allow_abbrev=False: a flag must be spelled as SGLang defines it, not as a prefix that happens to match.
        assert not rejected, f"{example.name}: sglang {version} rejects the rendered args: {rejected}"


@runs_for(lambda: [_router_run()])
def test_router_flags_accepted(runner: Runner) -> None:
    if not (router_dir() / ".complete").exists():
        pytest.fail(f"{router_dir()} is missing: rerun bash hack/decode-path-env.sh", pytrace=False)
    cases = _router_cases()
    assert {label for label, _, _ in cases} >= {p.stem for p in EXAMPLES}, "an example renders no router"
    assert {module for _, module, _ in cases} == {"sglang_router.launch_router", "smg.launch_router"}
    rejected = {f"{label} ({module})": err for (label, module, _), err in zip(cases, runner.json(_router_run())) if err}
    assert not rejected, f"the router parsers ({router_pins()}) reject the rendered args: {rejected}"
