"""operator/specserving/data/flags.json is exactly what the real parsers say, and admission's argv reader
(operator/specserving/argv.py) refuses exactly the command lines each version's real `ServerArgs` parser refuses."""

from __future__ import annotations

import difflib
import json
from typing import Any

import pytest

from .conftest import VERSIONS, Run, Runner, gen, router_dir, router_run, runs_for, script_run

pytestmark = pytest.mark.decode_path

# Command lines admission must read as SGLang does: prefixes, aliases, "=" forms, nargs, types, choices, flags
# removed or added between versions, and the adversarial lines of issue 19. Every case runs after a model path
# (SGLang requires none, but every rendered line has one).
CASES: list[list[str]] = [
    [], ["--tp-size", "8"], ["--tp", "8"], ["--tensor-parallel-size=8"], ["--tp-size"], ["--tp-size", "eight"],
    ["--disaggregation-mod", "prefill"], ["--disaggregation-mode", "both"], ["--speculative-al", "NGRAM"],
    ["--speculative-al=NGRAM"], ["--cuda-graph-bs", "8"], ["--cuda-graph-bs", "1", "2"],
    ["--cuda-graph-bs-decode", "1", "2", "4"], ["--pp-size", "2"], ["--moe-a2a-backend", "deepep"],
    ["--moe-runner-backend", "foo"], ["--tool-call-parser", "deepseekv41"], ["--tool-call-parser", "deepseekv3"],
    ["--reasoning-parser", "deepseek-r1"], ["--enable-dp-attention"], ["--enable-dp-attention=1"],
    ["--enable-dp-lm-head"], ["--mem-fraction-static", "0.85"], ["--mem-fraction-static", "-0.5"],
    ["--mem-fraction-static", "abc"], ["--max-total-tokens", "1Ki"], ["--max-total-tokens", "25.6k"],
    ["--max-total-tokens", "many"], ["--json-model-override-args", "{"], ["--json-model-override-args", "{}"],
    ["--page-size", "64", "--page-size=32"], ["--enable"], ["--log-req", "--log-requests-level", "2"],
    ["stray"], ["--", "--tp-size", "8"], ["--no-such-flag"], ["--config"], ["--dsv4-attn-backend", "flashmla"],
    ["--enable-pd-role-switch"], ["--attn-dp-size", "8"], ["--disable-cuda-graph"], ["-h"],
    ["--node-rank", "$(LWS_WORKER_INDEX)"],
]
MODEL = ["--model-path", "/m"]

DUMP_AND_PARSE = r"""
import argparse, contextlib, io, json
from sglang.srt.server_args import ServerArgs
from specserving_pdfix.flags import describe, server_args_parser
results = []
for case in CASES:
    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(case)
        results.append(None)
    except SystemExit:
        results.append(err.getvalue().strip() or "exit")
print(json.dumps({"options": describe(server_args_parser()), "cases": results}))
"""


def version_run(version: str) -> Run:
    return script_run(version, DUMP_AND_PARSE.replace("CASES", json.dumps([MODEL + c for c in CASES])))


def router_runs() -> list[Run]:
    return [router_run(f"import json; from specserving_pdfix.flags import describe, router_parser; "
                       f"print(json.dumps({{'options': describe(router_parser({module!r}))}}))")
            for module in gen.ROUTER_MODULES.values()]


def _all_runs() -> list[Run]:
    return [version_run(v) for v in VERSIONS] + router_runs()


@pytest.fixture(scope="module")
def dumps(runner: Runner) -> dict[str, Any]:
    if not (router_dir() / ".complete").exists():
        pytest.fail(f"{router_dir()} is missing: rerun bash hack/decode-path-env.sh", pytrace=False)
    return {"sglang": {v: runner.json(version_run(v)) for v in VERSIONS},
            "routers": {name: runner.json(run)["options"] for name, run in zip(gen.ROUTER_MODULES, router_runs())}}


@runs_for(_all_runs)
def test_committed_flag_table_matches_the_wheels(dumps: dict[str, Any]) -> None:
    server = {v: dumps["sglang"][v]["options"] for v in VERSIONS}
    regenerated = gen.render_flags(gen.build_flags(server, dumps["routers"]))
    committed = gen.FLAGS.read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), regenerated.splitlines(True),
                                        "committed", "regenerated from the wheels"))
    assert not diff, f"flags.json is stale: run `python3 hack/gen-capabilities.py`\n{diff[:6000]}"


def test_router_modules_are_the_rendered_launchers() -> None:
    from specserving.rendering.router import LAUNCHERS

    assert {name: ["python3", "-m", module] for name, module in gen.ROUTER_MODULES.items()} == LAUNCHERS


ERROR_CLASSES = ("ambiguous option", "unrecognized arguments", "expected", "invalid", "ignored explicit argument")


def _kind(message: str) -> str:
    """The kind of an argparse error, from its last line ("prog: error: ...", after the usage text)."""
    last = message.strip().splitlines()[-1].lower() if message.strip() else ""
    return next((c for c in ERROR_CLASSES if c in last), "other")


@runs_for(lambda version: _all_runs())
@pytest.mark.parametrize("version", VERSIONS)
def test_admission_refuses_what_the_real_parser_refuses(dumps: dict[str, Any], version: str) -> None:
    """Side by side on every case: the real parser exits exactly when argv.parse finds an error, and the kind of
    error argparse prints is among the kinds argv.parse reports. -h is the one exit that is not an error (it
    prints help), and a Kubernetes $(VAR) value is left to the kubelet."""
    from specserving import argv

    grammar = argv.sglang(version)
    disagreements = []
    for case, real in zip(CASES, dumps["sglang"][version]["cases"]):
        words = MODEL + case
        parsed = argv.parse(argv.tokens(words, "case"), grammar)
        ours = {_kind(e.message) for e in parsed.errors}
        if any("$(" in w for w in case):
            real = None  # the kubelet expands it before SGLang parses it
        if case == ["-h"]:
            ours = {"help"} if any(s.option.dest == argv.HELP_DEST for s in parsed.settings) else ours
            real = "help" if real == "exit" else real
            if ours == {"help"} and real == "help":
                continue
        if (real is None) != (not ours) or (real is not None and _kind(real) not in ours):
            real_error = real.strip().splitlines()[-1] if real else None
            disagreements.append((case, real_error, sorted(e.message for e in parsed.errors)))
    assert not disagreements, f"sglang {version}: argv.parse and the real parser disagree: {disagreements}"
