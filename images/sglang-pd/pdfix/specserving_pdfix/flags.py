"""The command-line surface of the installed SGLang: every option of `ServerArgs`, with its choices.

`python -m specserving_pdfix.flags [--check ARG ...]` prints JSON: the SGLang version and, for each option
string, its destination, its choices (or null) and whether it takes a value; or, with --check, parses the
given argument list with the real `ServerArgs` parser and reports what it rejects. The operator's renderer
is checked against this, per version, in tests/decode_path.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any


def server_args_parser() -> argparse.ArgumentParser:
    """A parser populated by the installed SGLang's own `ServerArgs.add_cli_args`."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Option string -> {dest, choices, nargs, takes_value, deprecated_help}."""
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:  # argparse keeps no public list of actions
        choices = None
        if action.choices is not None:
            choices = sorted(str(c) for c in action.choices)
        for opt in action.option_strings:
            options[opt] = {
                "dest": action.dest,
                "choices": choices,
                "nargs": action.nargs if isinstance(action.nargs, (int, str, type(None))) else str(action.nargs),
                "takes_value": action.nargs != 0,
                "help": (action.help or "")[:300],
            }
    return dict(sorted(options.items()))


def check(args: list[str]) -> dict[str, Any]:
    """Parse `args` with the real parser; report the error text argparse would print, or None."""
    parser = server_args_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit as exc:
        return {"ok": False, "exit": exc.code, "error": err.getvalue().strip()}
    return {"ok": True, "error": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specserving_pdfix.flags", description=__doc__.splitlines()[0])
    ap.add_argument("--check", nargs=argparse.REMAINDER, help="parse these SGLang server arguments")
    ns = ap.parse_args(argv)
    from specserving_pdfix.probe import sglang_version

    if ns.check is not None:
        result = check(ns.check)
        print(json.dumps({"sglang": sglang_version(), **result}, indent=2))
        return 0 if result["ok"] else 1
    print(json.dumps({"sglang": sglang_version(), "options": describe(server_args_parser())}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
