"""argv.parse reads a command line as Python's own argparse does: checked side by side against an argparse parser
built from the same generated option data, on hand-picked and on random command lines."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserving import argv

GRAMMAR = argv.sglang("0.5.23")
# A slice of SGLang 0.5.23's options with every shape admission meets: one value, flags, "+" lists, choices, ints,
# floats, JSON, SGLang's suffixed integers, options that share a prefix, and aliases of one dest.
NAMES = ["--tp-size", "--tensor-parallel-size", "--page-size", "--cuda-graph-bs-decode", "--cuda-graph-bs-prefill",
         "--enable-metrics", "--enable-dp-attention", "--tool-call-parser", "--mem-fraction-static",
         "--json-model-override-args", "--max-total-tokens", "--watchdog-timeout", "--kv-cache-dtype",
         "--disaggregation-mode", "--log-requests", "--log-requests-level", "--enable-tf32-matmul",
         "--no-enable-tf32-matmul", "--context-length", "--help"]
SUBSET = argv.Grammar("SGLang 0.5.23 (slice)", {n: GRAMMAR.options[n] for n in NAMES})


def _size(value: str) -> int:
    if argv.SIZE.fullmatch(value.strip()):
        return 1
    return int(value)


CONVERTERS: dict[str | None, Any] = {"int": int, "float": float, "json": json.loads, "size": _size, "str": str,
                                     "any": str, None: None}


def reference_parser(grammar: argv.Grammar) -> argparse.ArgumentParser:
    """A real argparse parser with the grammar's options (aliases grouped by dest, as SGLang declares them)."""
    parser = argparse.ArgumentParser(prog="reference", add_help=False, exit_on_error=False)
    by_dest: dict[str, list[argv.Option]] = {}
    for option in grammar.options.values():
        by_dest.setdefault(option.dest, []).append(option)
    for dest, options in by_dest.items():
        names = [o.name for o in options]
        first = options[0]
        if first.nargs == 0:
            parser.add_argument(*names, dest=dest, action="store_const", const=True)
            continue
        convert = CONVERTERS[first.type]
        choices = None
        if first.choices is not None:
            choices = [convert(c) if convert is not _size else c for c in first.choices]
        parser.add_argument(*names, dest=dest, nargs=first.nargs, type=convert, choices=choices)
    return parser


REFERENCE = reference_parser(SUBSET)


ERROR_CLASSES = ("ambiguous option", "unrecognized arguments", "expected", "invalid", "ignored explicit argument")


def error_class(message: str) -> str:
    """What kind of refusal a message is, in argparse's words (ours and argparse's share them)."""
    return next((c for c in ERROR_CLASSES if c in message), message)


def reference_error(words: list[str]) -> str | None:
    """The kind of error argparse exits with, or None when it accepts the line."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            REFERENCE.parse_args(words)
    except argparse.ArgumentError as exc:
        return error_class(str(exc))
    except SystemExit:
        return error_class(err.getvalue())
    return None


def agree(words: list[str]) -> argv.Parsed:
    """Ours refuses exactly when argparse does, and among our errors is the kind argparse reports first."""
    parsed = ours(words)
    expected = reference_error(words)
    if expected is None:
        assert not parsed.errors, (words, [e.message for e in parsed.errors])
    else:
        assert expected in {error_class(e.message) for e in parsed.errors}, (words, expected,
                                                                              [e.message for e in parsed.errors])
    return parsed


def ours(words: list[str]) -> argv.Parsed:
    return argv.parse(argv.tokens(words, "spec.decode.extraArgs", user=True, indexed=True), SUBSET)


@pytest.mark.parametrize("words", [
    ["--tp-size", "8"], ["--tp-size=8"], ["--tp", "8"], ["--tensor", "8"], ["--tp-size"], ["--tp-size", "x"],
    ["--cuda-graph-bs", "8"], ["--cuda-graph-bs-d", "1", "2", "4"], ["--cuda-graph-bs-decode"],
    ["--enable-metrics=1"], ["--enable-metrics", "1"], ["--tool-call-parser", "nope"],
    ["--tool-call-parser", "deepseekv4"], ["--mem-fraction-static", "-0.5"], ["--mem-fraction-static", "-x"],
    ["--mem-fraction-static=-x"], ["--json-model-override-args", "{"], ["--json-model-override-args", "{}"],
    ["--max-total-tokens", "1Ki"], ["--max-total-tokens", "1.5Ki"], ["--max-total-tokens", "25.6k"],
    ["--max-total-tokens", "abc"], ["positional"], ["--", "--tp-size", "8"], ["--enable"], ["--enable-dp"],
    ["--no-enable-tf32"], ["--log-requests", "--log-requests-level", "2"], ["--log-requests-l", "2"],
    ["-h"], ["--he"], ["--context-length", "-1"], ["--page-size", "a b"], ["--unknown", "1"], ["-x"],
    ["--page-size", "-"], ["--page-size", "-a b"], ["--page-size=a", "b"],
])
def test_agrees_with_argparse_on_chosen_lines(words: list[str]) -> None:
    agree(words)


WORDS = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(NAMES).map(lambda n: n[:max(3, len(n) // 2)]),  # prefixes, some ambiguous
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["8", "x", "-1", "0.5", "{}", "auto", "1k", ""]))
    .map(lambda t: f"{t[0]}={t[1]}"),
    st.sampled_from(["8", "16", "-1", "-0.5", "0.85", "x", "auto", "fp8_e4m3", "deepseekv4", "decode", "1Mi",
                     "{}", "[1]", "a b", "-a b", "-", "--", "-x", "--nope"]),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_agrees_with_argparse_on_random_lines(words: list[str]) -> None:
    parsed = agree(words)
    if not parsed.errors:
        namespace = vars(REFERENCE.parse_args(words))
        assert {s.option.dest for s in parsed.settings} == {d for d, v in namespace.items() if v is not None}


def test_every_error_names_the_token_it_came_from() -> None:
    parsed = ours(["--watchdog-timeout", "1", "--tool-call-parser", "nope", "stray"])
    assert [(e.token.origin, e.token.text) for e in parsed.errors] == [
        ("spec.decode.extraArgs[3]", "nope"), ("spec.decode.extraArgs[4]", "stray")]


def test_kubernetes_references_are_left_to_the_kubelet() -> None:
    assert not ours(["--tp-size", "$(TP)"]).errors


def test_unknown_versions_read_with_every_known_option_inexactly() -> None:
    grammar = argv.sglang("9.9.9")
    assert not grammar.exact and "--cuda-graph-bs-decode" in grammar.options
    assert argv.sglang("0.5.23").exact and "--cuda-graph-bs" not in argv.sglang("0.5.23").options
    assert "--cuda-graph-bs" in argv.sglang("0.5.19").options  # removed in 0.5.20


def test_routers_have_their_own_grammar() -> None:
    smg, sglang_router = argv.router("smg"), argv.router("sglang-router")
    assert smg is not None and sglang_router is not None
    assert "--disable-tokenizer-autoload" in smg.options
    assert "--disable-tokenizer-autoload" not in sglang_router.options
    assert argv.router("nginx") is None
