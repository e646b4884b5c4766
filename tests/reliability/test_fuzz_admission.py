"""Fuzzed SpecServings through real `kubectl apply`, with the operator serving the validating webhook.

Hypothesis generates valid objects and invalid ones (a valid one broken by one to three mutations: types, bounds,
enums, unknown and missing fields, patterns, cross-field CEL rules, the operator's own rules, names). The offline
`specserving.validation.validate` is the oracle; the API server with the webhook must agree with it on every
object: each invalid one refused with a field path the oracle names, nothing of it stored; each valid one
admitted, stored and reconciled (Admitted=True for its generation; for those whose base image serves, exactly
the children `specserving render` gives). Throughout, the operator process stays up, its log holds no traceback,
and no traceback reaches kubectl's output, an event or a condition.

CI size: 40 invalid + 12 valid. SPECSERVING_RELIABILITY=full: 1,000 invalid + 100 valid (plus the few
mutated objects the oracle finds valid, checked as valid).

Then with the webhook off (as during an outage with failurePolicy Ignore, or a SpecServing stored before the
webhook existed): objects that only the operator's own rules forbid are stored, and the reconciler must answer
each with Admitted=False/InvalidSpec naming a field path the oracle names, create no child, write no traceback
and stay up. CI size: 20; full: 200.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest
import yaml
from cluster.kube import Cluster, condition, wait_for
from cluster.operating import CHILD_KINDS, Operator
from cluster.test_admission import WebhookOperator, webhook
from hypothesis import HealthCheck, assume, given, settings
from specserving.api.loading import defaulted, spec_of
from specserving.capabilities import load
from specserving.imagebuild.planning import NOT_NEEDED
from specserving.imagebuild.planning import plan as plan_image
from specserving.validation import validate

from .faults import FULL, events_text, expected_children, figure, size, tracebacks
from .specs import mutated_specs, operator_invalid_specs, valid_specs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600 if FULL else 420)]
__all__ = ["webhook"]  # a fixture (tests/cluster/test_admission.py), used by name

INVALID = size(40, 1000)
VALID = size(12, 100)
OPERATOR_INVALID = size(20, 200)
FUZZ = settings(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
# A field path as the API server and the webhook print them: spec.engine.dp, spec.decode.extraArgs[0], metadata.name
FIELD_PATH = re.compile(r"\b(?:spec|metadata)(?:\.[A-Za-z0-9]+|\[\d+\])*")


def kubectl_apply(cluster: Cluster, ns: str, obj: dict[str, Any]) -> tuple[int, str]:
    # JSON, not YAML: kubectl reads YAML 1.1, where a key such as n or y that PyYAML leaves unquoted is a boolean.
    out = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)
    return out.returncode, out.stdout + out.stderr


def _mentions(text: str, path: str) -> bool:
    """`path` (the oracle's) or its parent object appears in the API server's answer."""
    candidates = {path, re.sub(r"\[\d+\]$", "", path)}
    return any(re.search(re.escape(c) + r"(?![A-Za-z0-9])", text) for c in candidates if c)


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.mutations: Counter[str] = Counter()
        self.seconds = 0.0
        self.valid: list[dict[str, Any]] = []


def test_fuzzed_specs_agree_with_the_oracle_and_never_hurt_the_operator(cluster: Cluster, namespace: str,
                                                                         webhook: WebhookOperator) -> None:
    ns, tally = namespace, Tally()

    def check(obj: dict[str, Any], what: list[str]) -> bool:
        """Apply `obj` and compare with the oracle; returns whether the oracle admits it."""
        report = validate(obj)
        started = time.monotonic()
        rc, text = kubectl_apply(cluster, ns, obj)
        tally.seconds += time.monotonic() - started
        assert not tracebacks(text), text
        if report.ok:
            assert rc == 0, f"the oracle admits it, the API server refused ({what}):\n{text}\n{yaml.safe_dump(obj)}"
            tally.counts["valid admitted"] += 1
            tally.valid.append(obj)
            return True
        assert rc != 0, f"the oracle refuses it ({report.summary()}), the API server admitted it ({what})"
        paths = FIELD_PATH.findall(text)
        assert paths, f"refused without a field path ({what}):\n{text}"
        # A rule on the whole object (the name length) has no path of its own and names the field in its message.
        oracle = [p for e in report.errors for p in ([e.path] if e.path else FIELD_PATH.findall(e.message))]
        assert any(_mentions(text, p) for p in oracle), (
            f"refused, but naming none of the oracle's paths {oracle} ({what}):\n{text}")
        tally.counts["invalid refused"] += 1
        tally.mutations.update(m.split(" ")[0] for m in what if "not applicable" not in m)
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and tally.counts["invalid refused"] % 10 == 1:
            assert cluster.get("specservings", name, ns) is None, f"refused {name} was stored"
        return False

    @settings(FUZZ, max_examples=INVALID)
    @given(mutated_specs())
    def invalid(case: tuple[dict[str, Any], list[str]]) -> None:
        # A mutation that happens to leave the object valid is checked as valid, and not counted here.
        assume(not check(*case))

    @settings(FUZZ, max_examples=VALID)
    @given(valid_specs())
    def valid(obj: dict[str, Any]) -> None:
        check(obj, ["valid"])

    invalid()
    valid()
    n = sum(tally.counts.values())
    figure(f"fuzzed {n} SpecServings through kubectl apply with the webhook: {dict(tally.counts)} "
           f"({tally.seconds / max(n, 1):.2f}s per apply); mutations among the refused: {dict(tally.mutations)}")
    assert tally.counts["invalid refused"] >= INVALID

    # Every stored object is one the oracle admitted.
    stored = {o["metadata"]["name"]: o for o in cluster.list("specservings", ns)}
    assert set(stored) == {o["metadata"]["name"] for o in tally.valid}

    # Every admitted one is reconciled: Admitted=True for its generation; where the base image serves (no build)
    # and no other CRD is needed, its children are exactly the rendered ones.
    table = load()

    def not_admitted() -> list[str]:
        """Each SpecServing not yet Admitted=True for its generation, with what its status says instead."""
        return [f"{o['metadata']['name']}: Admitted={c and (c['status'], c['reason'], c['message'][:200])}, "
                f"Degraded={(d := condition(o, 'Degraded')) and (d['status'], d['reason'], d['message'][:300])}"
                for o in cluster.list("specservings", ns)
                if not ((c := condition(o, "Admitted")) and c["status"] == "True"
                        and c.get("observedGeneration") == o["metadata"]["generation"])]

    deadline = time.monotonic() + 120
    while (left := not_admitted()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"{len(left)} admitted SpecServings not reconciled (Admitted=True) within 120 s: {left[:5]}"
    plain = []
    for name, obj in sorted(stored.items()):
        spec = spec_of(defaulted({k: v for k, v in obj.items() if k != "status"}))
        if plan_image(spec, table, fix_version="x", default_registry=None).decision == NOT_NEEDED \
                and spec.prefill.nodes_per_replica == spec.decode.nodes_per_replica == 1 \
                and not spec.engine.metrics.service_monitor:
            plain.append(name)

    def children_match() -> list[str]:
        wrong = []
        for name in plain:
            obj = cluster.get("specservings", name, ns)
            have = {(c["kind"], c["metadata"]["name"]) for c in cluster.list(
                "deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets", ns,
                f"specserving.io/instance={name}")}
            if obj is None or have != expected_children(obj, ns):
                wrong.append(name)
        return wrong

    wait_for(lambda: not children_match(), 120, f"the rendered children of {len(plain)} SpecServings")
    figure(f"{len(stored)} admitted SpecServings reconciled (Admitted=True); {len(plain)} of them (base image "
           "serves, one node per replica) have exactly their rendered children")

    # No traceback anywhere a user looks, and the operator is still up.
    for obj in cluster.list("specservings", ns):
        for c in (obj.get("status") or {}).get("conditions") or []:
            assert not tracebacks(c.get("message", "")), c
    assert not tracebacks(events_text(cluster, ns))
    assert webhook.proc.poll() is None, "the operator exited"
    log = webhook.log.read_text()
    assert not tracebacks(log), "\n".join(tracebacks(log)[:20])


def test_with_the_webhook_off_the_reconciler_refuses_what_only_the_operator_forbids(cluster: Cluster, namespace: str,
                                                                                   operator: Operator) -> None:
    ns = namespace
    stored: dict[str, tuple[list[str], list[str]]] = {}  # name -> (the oracle's paths, the mutations)
    schema_refused: list[str] = []

    @settings(FUZZ, max_examples=OPERATOR_INVALID)
    @given(operator_invalid_specs())
    def case(generated: tuple[dict[str, Any], list[str]]) -> None:
        obj, what = generated
        name = obj["metadata"]["name"] = f"off-{len(stored):04d}"
        report = validate(obj)
        assume(not report.ok)
        rc, text = kubectl_apply(cluster, ns, obj)
        assert not tracebacks(text), text
        if rc != 0:  # the CRD's own schema or CEL rules caught it after all: no webhook was needed
            schema_refused.append(f"{what}: {text.strip()[-200:]}")
            return
        stored[name] = ([p for e in report.errors for p in ([e.path] if e.path else FIELD_PATH.findall(e.message))],
                        what)

    case()
    assert len(stored) >= OPERATOR_INVALID // 2, (len(stored), schema_refused[:5])

    def pending() -> list[str]:
        out = []
        for name in stored:
            obj = cluster.get("specservings", name, ns)
            c = condition(obj, "Admitted") if obj else None
            if not (obj and c and c["status"] == "False"
                    and c.get("observedGeneration") == obj["metadata"]["generation"]):
                out.append(name)
        return out

    started = time.monotonic()
    wait_for(lambda: not pending(), 120, f"Admitted=False on {len(stored)} operator-invalid SpecServings")
    answered = time.monotonic() - started
    rules: Counter[str] = Counter()
    for name, (paths, what) in sorted(stored.items()):
        obj = cluster.get("specservings", name, ns)
        assert obj is not None
        c = condition(obj, "Admitted")
        assert c is not None and c["reason"] == "InvalidSpec", (name, what, c)
        assert any(_mentions(c["message"], p) for p in paths), (name, what, paths, c["message"])
        assert not tracebacks(c["message"]), c
        assert cluster.list(CHILD_KINDS, ns, f"specserving.io/instance={name}") == [], f"{name} ({what}) got children"
        rules.update(what)
    figure(f"webhook off: {len(stored)} SpecServings only the operator's rules forbid were stored, and the reconciler "
           f"answered every one Admitted=False/InvalidSpec with the oracle's field path and no child "
           f"({answered:.1f}s after the last apply); {len(schema_refused)} generated ones the CRD schema refused "
           f"itself; rules: {dict(rules)}")
    assert not tracebacks(events_text(cluster, ns))
    assert operator.proc.poll() is None, "the operator exited"
    log = operator.log.read_text()
    assert not tracebacks(log), "\n".join(tracebacks(log)[:20])
