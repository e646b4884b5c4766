"""The command-line surface of the installed SGLang: every option of `ServerArgs`, with its choices.

`python -m specserving_pdfix.flags [--router MODULE] [--check ARG ...]` prints JSON: the SGLang version and, for
each option string, its destination, nargs, value type, choices (or null) and whether it is deprecated (with
--router, the same for a router launcher's parser); or, with --check, parses the given argument list with the
real `ServerArgs` parser and reports what it rejects. hack/gen-capabilities.py turns the dumps into the
operator's flag table (operator/specserving/data/flags.json). The operator's renderer
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


# How admission reads an option's values (operator/specserving/cmdline.py): the converters SGLang and the routers
# use, by name. A converter not named here is recorded as "any": admission parses its values but cannot check them.
TYPE_NAMES = {"int": "int", "float": "float", "str": "str", "loads": "json", "nullable_str": "str",
              "human_readable_int": "size"}


def _type_name(action: argparse.Action) -> str:
    if action.type is None:
        return "str"
    return TYPE_NAMES.get(getattr(action.type, "__name__", ""), "any")


def _nargs(action: argparse.Action) -> int | str | None:
    nargs = action.nargs
    if nargs is None or isinstance(nargs, int) or nargs in ("?", "*", "+"):
        return nargs
    return "*"  # argparse.REMAINDER and other patterns: reads what follows


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Option string -> {dest, nargs, type, choices, deprecated}: what argparse needs to parse a command line the
    way this parser does. nargs is argparse's (None: one value, 0: none, "?", "*", "+" or a count)."""
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:  # argparse keeps no public list of actions
        if isinstance(action, argparse._HelpAction):
            continue
        choices = None
        if action.choices is not None:
            choices = sorted(str(c) for c in action.choices)
        for opt in action.option_strings:
            options[opt] = {
                "dest": action.dest,
                "nargs": _nargs(action),
                "type": _type_name(action) if action.nargs != 0 else None,
                "choices": choices,
                "deprecated": "deprecated" in type(action).__name__.lower()
                or (action.help or "").lower().startswith("deprecated"),
            }
    return dict(sorted(options.items()))


def router_parser(module: str) -> argparse.ArgumentParser:
    """The parser `python -m MODULE` builds (sglang_router.launch_router or smg.launch_router): the module's
    own `RouterArgs.add_cli_args`, as its `parse_router_args` calls it."""
    import importlib

    router_args = importlib.import_module(module).RouterArgs
    parser = argparse.ArgumentParser(prog=module)
    router_args.add_cli_args(parser, use_router_prefix=False)
    return parser


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
    ap.add_argument("--router", metavar="MODULE", help="describe this router launcher's parser instead of SGLang's")
    ap.add_argument("--check", nargs=argparse.REMAINDER, help="parse these SGLang server arguments")
    ns = ap.parse_args(argv)
    if ns.router:
        print(json.dumps({"router": ns.router, "options": describe(router_parser(ns.router))}, indent=2))
        return 0
    from specserving_pdfix.probe import sglang_version

    if ns.check is not None:
        result = check(ns.check)
        print(json.dumps({"sglang": sglang_version(), **result}, indent=2))
        return 0 if result["ok"] else 1
    print(json.dumps({"sglang": sglang_version(), "options": describe(server_args_parser())}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
