"""Admission of the rendered command lines: each pool's SGLang argv and the router's, read by the target
version's own parser rules (argv.py, from data/flags.json), every problem blamed on the field that wrote the token.

What it refuses, beyond what argparse itself would (unknown options, ambiguous prefixes, missing values, types,
choices): a user token that sets a setting the operator renders (whatever alias or prefix spells it), a setting
given twice, and options that would take the pod out of the operator's hands (--config, --help, PD role switching).
"""

from __future__ import annotations

from collections.abc import Mapping

from specserving import argv
from specserving.api.types import SpecServingSpec
from specserving.problems import Problem, Report
from specserving.rendering import router
from specserving.rendering.args import FORBIDDEN_FLAGS, OWNED_FLAGS, typed_server_args
from specserving.rendering.image import sglang_version
from specserving.rendering.labels import DECODE, PREFILL

ENGINE_EXTRA_ARGS = "spec.engine.extraArgs"
ROLE_SWITCH_FLAG = "--enable-pd-role-switch"
# Options a user may never add, with why (beyond the flags the operator renders).
REFUSED = {
    **FORBIDDEN_FLAGS,
    ROLE_SWITCH_FLAG: "it makes SGLang refuse every speculative algorithm; remove it",
    "--help": "the program prints its help and exits, so the pod restarts forever; remove it",
}


def _typed_tokens(args: list[str], owners: Mapping[str, str], role: str) -> list[argv.Token]:
    """Tokens of a typed command line, each blamed on the field that renders its flag."""
    found: list[argv.Token] = []
    origin = "spec"
    for text in args:
        if text.startswith("--"):
            owner = owners.get(text.partition("=")[0], "spec")
            origin = owner.replace("<pool>", role) if owner.startswith("spec.") else "spec"
        found.append(argv.Token(text, origin))
    return found


def server_tokens(spec: SpecServingSpec, role: str) -> list[argv.Token]:
    """One pool's SGLang argv as tokens, in the order the renderer writes it (args.server_args)."""
    multinode = spec.pool(role).nodes_per_replica > 1
    return [*_typed_tokens(typed_server_args(spec, role, multinode=multinode), OWNED_FLAGS, role),
            *argv.tokens(spec.engine.extra_args or [], ENGINE_EXTRA_ARGS, user=True, indexed=True),
            *argv.tokens(spec.pool(role).extra_args or [], f"spec.{role}.extraArgs", user=True, indexed=True)]


def router_tokens(spec: SpecServingSpec, name: str = "x") -> list[argv.Token]:
    """The router's argv as tokens (rendering/router.router_args); the name only shapes selector values."""
    return [*_typed_tokens(router.typed_router_args(name, spec, "0" * 8), router.ROUTER_OWNED_FLAGS, ""),
            *argv.tokens(spec.router.extra_args or [], "spec.router.extraArgs", user=True, indexed=True)]


def _owners(grammar: argv.Grammar, owned: Mapping[str, str]) -> dict[str, str]:
    """dest -> what decides it, for every dest an owned flag sets in this grammar."""
    found: dict[str, str] = {}
    for flag, owner in owned.items():
        dest = grammar.dest_of(flag)
        if dest is not None:
            found.setdefault(dest, owner)
    return found


def _fix(error: argv.ArgError, grammar: argv.Grammar) -> str:
    message = error.message
    if message.startswith("ambiguous option"):
        return "spell the option in full"
    if "no such option" in message:
        return f"remove it, or use an option {grammar.program} has (see its --help)"
    if "no option before it" in message:
        return "remove it, or put the option it belongs to before it"
    if "invalid choice" in message and not error.token.user:
        accepting = _versions_accepting(error)
        if accepting:
            return f"use one of the listed values, or an SGLang version that accepts it ({', '.join(accepting)})"
    if "invalid" in message:
        return "use a value the option accepts"
    return "give the option the values it takes"


def _versions_accepting(error: argv.ArgError) -> list[str]:
    """The SGLang versions whose parser takes the typed field's value for the option in the error."""
    name = error.message.removeprefix("argument ").split(":", 1)[0]
    return [v for v in argv.known_sglang_versions()
            if (opt := argv.sglang(v).options.get(name)) is not None and opt.choices is not None
            and error.token.text in opt.choices]


def check_argv(tokens: list[argv.Token], grammar: argv.Grammar, owned: Mapping[str, str], what: str) -> Report:
    """Every problem of one container's argv. `owned`: flag -> the field (or "the operator") that decides it;
    `what` names the container in messages ("the decode pool")."""
    report = Report()
    parsed = argv.parse(tokens, grammar)
    for error in parsed.errors:
        if grammar.exact:
            report.errors.append(Problem(error.token.origin, (
                f'Invalid value: "{error.token.text}": {grammar.program} would exit at start-up: {error.message}; '
                f"{_fix(error, grammar)}")))
        else:
            known = argv.known_sglang_versions()
            report.warnings.append(Problem(error.token.origin, (
                f'"{error.token.text}": {error.message.replace(f" ({grammar.program} has no such option)", "")} '
                f"in every SGLang version the operator knows ({known[0]} to {known[-1]}); the image's version is "
                "not known, so its own parser decides at start-up")))
    owners = _owners(grammar, owned)
    refused = _owners(grammar, REFUSED)
    first: dict[str, argv.Setting] = {}
    for setting in parsed.settings:
        dest, token = setting.option.dest, setting.token
        earlier = first.setdefault(dest, setting)
        if not token.user:
            continue
        if dest in owners:
            owner = owners[dest].replace("<pool>", what.split()[1] if what.startswith("the ") else "<pool>")
            fix = (f"which the operator renders from {owner}; remove it from extraArgs and set that field instead"
                   if owner.startswith("spec.") else f"which {owner} decides; remove it from extraArgs")
            report.errors.append(Problem(token.origin, (
                f'Forbidden: "{setting.spelled}" sets {setting.option.name}, {fix}')))
        elif dest in refused:
            report.errors.append(Problem(token.origin, f'Forbidden: "{setting.spelled}": {refused[dest]}'))
        elif earlier is not setting and _overrides(setting, earlier):
            report.warnings.append(Problem(token.origin, (
                f"{setting.option.name} overrides {earlier.token.origin} for {what} (a pool's extraArgs come "
                "after engine.extraArgs)")))
        elif earlier is not setting:
            report.errors.append(Problem(token.origin, (
                f'Invalid value: "{setting.spelled}": {earlier.token.origin} already sets {setting.option.name}, '
                f"and {grammar.program} would keep only the last value; set it once")))
        else:
            if setting.spelled != setting.option.name and setting.spelled not in grammar.options:
                report.warnings.append(Problem(token.origin, (
                    f'"{setting.spelled}" abbreviates {setting.option.name}; spell it in full (a later SGLang may add '
                    "an option that makes the abbreviation ambiguous, and the pod would then fail to start)")))
            if setting.option.deprecated:
                report.warnings.append(Problem(token.origin, (
                    f"{setting.option.name} is deprecated in {grammar.program}; see its --help for the replacement")))
    return report


class UserSettings:
    """What one pool's extraArgs (spec.engine's and the pool's) set, read once: admission asks for several flags
    per pool, and parsing the whole command line for each was most of a webhook review's time."""

    def __init__(self, spec: SpecServingSpec, role: str) -> None:
        self.grammar = argv.sglang(sglang_version(spec))
        # Only extraArgs tokens are the user's: without any, nothing needs parsing.
        has_user_tokens = bool(spec.engine.extra_args or spec.pool(role).extra_args)
        self.parsed = argv.parse(server_tokens(spec, role), self.grammar) if has_user_tokens else None

    def of(self, flag: str) -> tuple[str, str] | None:
        """(field path, value) of the last extraArgs token that sets `flag` (by any alias or prefix), the value's
        words joined by spaces ("true" for a flag without one); None when extraArgs leave it to SGLang."""
        dest = self.grammar.dest_of(flag)
        if dest is None or self.parsed is None:
            return None
        found = [s for s in self.parsed.of(dest) if s.token.user]
        if not found:
            return None
        return found[-1].token.origin, " ".join(found[-1].values) or "true"


def _overrides(setting: argv.Setting, earlier: argv.Setting) -> bool:
    """A pool's extraArgs setting what engine.extraArgs set: the documented precedence, not an accident."""
    return earlier.token.user and earlier.token.origin.startswith(ENGINE_EXTRA_ARGS + "[") \
        and not setting.token.origin.startswith(ENGINE_EXTRA_ARGS + "[")


def check_command_lines(spec: SpecServingSpec) -> Report:
    """Both pools' SGLang command lines and the router's, as the image's own parsers would read them."""
    report = Report()
    grammar = argv.sglang(sglang_version(spec))
    for role in (PREFILL, DECODE):
        report.extend(check_argv(server_tokens(spec, role), grammar, OWNED_FLAGS, f"the {role} pool"))
    router_grammar = argv.router(router.implementation(spec))
    if router_grammar is not None:
        report.extend(check_argv(router_tokens(spec), router_grammar, router.ROUTER_OWNED_FLAGS, "the router"))
    return _unique(report)


def _unique(report: Report) -> Report:
    """engine.extraArgs is parsed once per pool: report each problem once."""
    out = Report()
    for problem in report.errors:
        if problem not in out.errors:
            out.errors.append(problem)
    for problem in report.warnings:
        if problem not in out.warnings:
            out.warnings.append(problem)
    return out
