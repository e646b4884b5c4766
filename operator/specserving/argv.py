"""Command lines read the way SGLang's and the routers' own argparse parsers read them, from generated data.

data/flags.json holds every option of each SGLang version's `ServerArgs` parser and of each router launcher's
parser (hack/gen-capabilities.py dumps them from the real wheels). `parse` follows argparse's rules for long
options (Python 3.10-3.12, `allow_abbrev` on, as every one of these parsers is built):

- `--name value` and `--name=value`; an exact option string wins, else a unique prefix of one (`--disaggregation-mod`
  is `--disaggregation-mode`), and a prefix of several is an error;
- a token that starts with "-" is an option, unless it looks like a negative number (none of these parsers has
  options that do), so a value cannot start with "-" unless given as `--name=-1`;
- nargs decide how many of the following values an option takes; anything left over is an unrecognized argument;
- values are converted with the option's type (int, float, json) and checked against its choices.

Every token carries the field path it came from, so an error names the field to change. Tokens holding a
Kubernetes `$(VAR)` reference are expanded by the kubelet, so their types cannot be checked here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

# argparse's pattern for a token that is a value although it starts with "-".
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# SGLang's human_readable_int: an integer, or a number with an SI (decimals allowed) or IEC (whole) suffix.
SIZE = re.compile(r"\d+(\.\d+)?[kMGT]|\d+(Ki|Mi|Gi|Ti)")
KUBERNETES_EXPANSION = "$("
HELP_DEST = "help"


@dataclass(frozen=True)
class Option:
    """One option string of a parser (aliases are separate Options with the same dest)."""

    name: str
    dest: str
    nargs: int | str | None  # argparse's: None one value, 0 none, "?", "*", "+", or a count
    # int, float, str, json, size (SGLang's integer with an optional k/M/G/T or Ki/Mi/Gi/Ti suffix), any (a
    # converter of the program's own, unchecked), None (takes no value)
    type: str | None
    choices: tuple[str, ...] | None = None
    deprecated: bool = False


@dataclass(frozen=True)
class Grammar:
    """The options of one program's parser. `exact` is False when the program's version is not in the data:
    the options are then every known version's, and what they cannot tell is a warning, not an error."""

    program: str
    options: Mapping[str, Option]
    exact: bool = True

    def spellings(self, dest: str) -> list[str]:
        """Every option string that sets `dest`."""
        return sorted(name for name, opt in self.options.items() if opt.dest == dest)

    def dest_of(self, name: str) -> str | None:
        opt = self.options.get(name)
        return opt.dest if opt is not None else None


@dataclass(frozen=True)
class Token:
    """One command-line word and the field path it came from (spec.decode.extraArgs[1], spec.engine.tp, ...)."""

    text: str
    origin: str
    user: bool = False  # written verbatim by the user (extraArgs), not rendered from a typed field


@dataclass(frozen=True)
class Setting:
    """An option as the parser resolved it, with the values it took."""

    option: Option
    spelled: str  # the option as written, without "=value"
    values: tuple[str, ...]
    token: Token


@dataclass(frozen=True)
class ArgError:
    token: Token
    message: str


@dataclass
class Parsed:
    settings: list[Setting] = field(default_factory=list)
    errors: list[ArgError] = field(default_factory=list)

    def of(self, dest: str) -> list[Setting]:
        return [s for s in self.settings if s.option.dest == dest]


# The help option every real parser has (argparse adds it; the dumps leave it out because it is not a setting).
_HELP = (Option("-h", HELP_DEST, 0, None), Option("--help", HELP_DEST, 0, None))


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(resources.files("specserving").joinpath("data/flags.json").read_text())
    return loaded


def _option(name: str, record: Mapping[str, Any]) -> Option:
    choices = record.get("choices")
    return Option(name, record["dest"], record["nargs"], record["type"],
                  tuple(choices) if choices is not None else None, bool(record.get("deprecated")))


def known_sglang_versions() -> list[str]:
    versions: list[str] = _data()["sglang"]["versions"]
    return versions


@lru_cache(maxsize=64)
def sglang(version: str | None) -> Grammar:
    """The `ServerArgs` parser of SGLang `version`; for a version the data lacks, every known version's options
    (the newest record of each), not exact."""
    options = _data()["sglang"]["options"]
    known = known_sglang_versions()
    picked: dict[str, Option] = {h.name: h for h in _HELP}
    if version in known:
        for name, variants in options.items():
            for record in variants:
                if version in record["versions"]:
                    picked[name] = _option(name, record)
        return Grammar(f"SGLang {version}", picked)
    for name, variants in options.items():
        newest = max(variants, key=lambda r: max(known.index(v) for v in r["versions"]))
        picked[name] = _option(name, newest)
    return Grammar(f"SGLang {version or '(version unknown)'}", picked, exact=False)


@lru_cache(maxsize=8)
def router(implementation: str) -> Grammar | None:
    """The parser of a router launcher (sglang-router, smg), or None for one the data lacks."""
    entry = _data()["routers"].get(implementation)
    if entry is None:
        return None
    picked: dict[str, Option] = {h.name: h for h in _HELP}
    picked.update({name: _option(name, record) for name, record in entry["options"].items()})
    return Grammar(entry["package"], picked)


def tokens(texts: Iterable[str], origin: str, *, user: bool = False, indexed: bool = False) -> list[Token]:
    """Tokens from one source: `indexed` appends each token's index to the origin (a list field's items)."""
    return [Token(t, f"{origin}[{i}]" if indexed else origin, user) for i, t in enumerate(texts)]


def _resolve(text: str, grammar: Grammar) -> tuple[Option | None, str | None, str | None]:
    """(option, explicit value after "=", error) for an option-like token, as argparse's _parse_optional."""
    if text in grammar.options:
        return grammar.options[text], None, None
    name, sep, explicit = text.partition("=")
    if sep and name in grammar.options:
        return grammar.options[name], explicit, None
    if text.startswith("--"):
        matches = sorted(o for o in grammar.options if o.startswith(name))
        if len(matches) > 1:
            return None, None, f"ambiguous option: {name} could match {', '.join(matches)}"
        if len(matches) == 1:
            return grammar.options[matches[0]], explicit if sep else None, None
    elif len(text) > 2 and text[:2] in grammar.options:
        # a short option with its value attached ("-hx")
        return grammar.options[text[:2]], text[2:], None
    return None, None, None


def canonical(text: str, grammar: Grammar) -> str | None:
    """The option string an option-like token sets, prefixes resolved (`--speculative-al=X` ->
    `--speculative-algorithm`); the token's own name when the grammar cannot resolve it; None for a value."""
    if _is_value(text, grammar):
        return None
    option, _, _ = _resolve(text, grammar)
    return option.name if option is not None else text.partition("=")[0]


def _is_value(text: str, grammar: Grammar) -> bool:
    """Whether argparse reads `text` as a value rather than an option (its _parse_optional, in its order)."""
    if not text.startswith("-") or text == "-":
        return True
    option, _, error = _resolve(text, grammar)
    if option is not None or error is not None:
        return False
    return bool(NEGATIVE_NUMBER.match(text)) or " " in text


def _convert(option: Option, value: str) -> str | None:
    """argparse's error for `value` of `option`, or None."""
    if KUBERNETES_EXPANSION in value:
        return None
    converted: Any = value
    try:
        if option.type == "int":
            converted = int(value)
        elif option.type == "float":
            converted = float(value)
        elif option.type == "json":
            converted = json.loads(value)
        elif option.type == "size" and not SIZE.fullmatch(value.strip()):
            converted = int(value)
    except ValueError:
        kind = {"json": "JSON", "size": "integer (or 1k, 1M, 1Ki...)"}.get(option.type or "", option.type)
        return f"argument {option.name}: invalid {kind} value: {value!r}"
    if option.choices is not None and str(converted) not in option.choices:
        shown = ", ".join(repr(c) for c in option.choices)
        return f"argument {option.name}: invalid choice: {value!r} (choose from {shown})"
    return None


def _takes(option: Option, available: int) -> tuple[int, str | None]:
    """How many of `available` following values `option` takes, or argparse's error."""
    nargs = option.nargs
    if nargs is None:
        return (1, None) if available >= 1 else (0, "expected one argument")
    if nargs == "?":
        return min(available, 1), None
    if nargs == "*":
        return available, None
    if nargs == "+":
        return (available, None) if available >= 1 else (0, "expected at least one argument")
    count = int(nargs)
    if available < count:
        return 0, f"expected {count} argument{'s' if count != 1 else ''}"
    return count, None


def parse(argv: Sequence[Token], grammar: Grammar) -> Parsed:
    """Read `argv` as `grammar`'s parser would: every setting, and every error argparse would exit with."""
    parsed = Parsed()
    i = 0
    while i < len(argv):
        token = argv[i]
        text = token.text
        if text == "--":
            rest = " ".join(t.text for t in argv[i + 1:])
            parsed.errors.append(ArgError(token, f"unrecognized arguments: {rest or '--'} (after \"--\" every "
                                                 "word is positional, and the program takes none)"))
            break
        if _is_value(text, grammar):
            parsed.errors.append(ArgError(token, f"unrecognized arguments: {text} (a value with no option before "
                                                 "it)"))
            i += 1
            continue
        option, explicit, error = _resolve(text, grammar)
        if error is not None or option is None:
            parsed.errors.append(ArgError(token, error or f"unrecognized arguments: {text} ({grammar.program} has "
                                                          "no such option)"))
            i += 1
            while i < len(argv) and _is_value(argv[i].text, grammar):
                i += 1  # its values belong to it, not to the program
            continue
        spelled = text.partition("=")[0] if explicit is not None else text
        if explicit is not None:
            if option.nargs == 0:
                parsed.errors.append(ArgError(token, f"argument {option.name}: ignored explicit argument "
                                                     f"{explicit!r}"))
                i += 1
                continue
            if isinstance(option.nargs, int) and option.nargs != 1:
                parsed.errors.append(ArgError(token, f"argument {option.name}: expected {option.nargs} arguments"))
                i += 1
                continue
            values: tuple[Token, ...] = (Token(explicit, token.origin, token.user),)
            i += 1
        else:
            available = 0
            while i + 1 + available < len(argv) and _is_value(argv[i + 1 + available].text, grammar):
                available += 1
            count, error = _takes(option, available)
            if error is not None:
                parsed.errors.append(ArgError(token, f"argument {option.name}: {error}"))
                i += 1
                continue
            values = tuple(argv[i + 1:i + 1 + count])
            i += 1 + count
        for value in values:
            problem = _convert(option, value.text)
            if problem is not None:
                parsed.errors.append(ArgError(value, problem))
        parsed.settings.append(Setting(option, spelled, tuple(v.text for v in values), token))
    return parsed
