"""Evaluate the CRD's CEL rules (x-kubernetes-validations) offline, as the apiserver does on admission.

The rules live only in the CRD (generated from types.py); this module lets `specserving validate` apply
them without a cluster, through cel-python.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel

from specserving.problems import Problem


# One environment per process: creating one raises the interpreter's recursion limit (celpy needs 2500), and
# doing that once at import keeps the limit stable for the rest of the process.
_ENV = celpy.Environment()


_FORMAT = re.compile(r"%%|%([ds])")


def _format(template: Any, args: Any) -> celtypes.StringType:
    """The `format` of Kubernetes' CEL strings library, for the %d and %s the CRD's messages use."""
    values = iter(args)

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%"
        value = next(values)
        return str(int(value)) if m.group(1) == "d" else str(value)

    return celtypes.StringType(_FORMAT.sub(one, str(template)))


@lru_cache(maxsize=None)
def _program(expr: str) -> Any:
    return _ENV.program(_ENV.compile(expr), functions={"format": _format})


def _evaluate(expr: str, value: Any) -> Any:
    return _program(expr).evaluate({"self": json_to_cel(value)})


def _rule_problems(path: str, value: Any, rules: list[dict[str, Any]]) -> list[Problem]:
    out = []
    for rule in rules:
        try:
            passed = bool(_evaluate(rule["rule"], value))
        except Exception as exc:  # a rule that cannot evaluate is a failed rule, as in the apiserver
            out.append(Problem(path, f"{rule['message']} (rule could not be evaluated: {exc})"))
            continue
        if passed:
            continue
        message = rule["message"]
        if "messageExpression" in rule:
            try:
                message = str(_evaluate(rule["messageExpression"], value))
            except Exception:  # the static message is the documented fallback
                pass
        out.append(Problem(path + rule.get("fieldPath", ""), message))
    return out


def check(value: Any, schema: dict[str, Any], path: str = "") -> list[Problem]:
    """Every CEL rule in `schema` that `value` breaks, with the path the rule blames."""
    problems: list[Problem] = []
    if schema.get("x-kubernetes-validations"):
        problems += _rule_problems(path, value, schema["x-kubernetes-validations"])
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                child = f"{path}.{name}" if path else name
                problems += check(value[name], prop, child)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += check(item, schema["items"], f"{path}[{i}]")
    return problems
