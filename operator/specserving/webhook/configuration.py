"""The ValidatingWebhookConfiguration for SpecServing, as a pure function of where the webhook listens."""

from __future__ import annotations

import base64
from typing import Any

from specserving import GROUP, PLURAL, VERSION

CONFIGURATION_NAME = "specserving-validating"
WEBHOOK_NAME = "validate.specservings.specserving.io"
HANDLER_ID = "validate-specserving"
TIMEOUT_SECONDS = 5
# Only creates and changes of the spec are reviewed. An update that leaves the spec alone (kopf's annotation patch
# after each handled change, a label, a finalizer) has nothing to review, and refusing one would be wrong: after an
# admin tightens the serving-pod policy it would block kopf's bookkeeping and the removal of a finalizer. It also
# halves a burst's reviews: 977-988 for 500 new SpecServings, half of them kopf's patches (docs/benchmarks.md).
SPEC_CHANGED = "request.operation != 'UPDATE' || object.spec != oldObject.spec"


def validating_configuration(ca_pem: bytes, *, url: str | None = None, service: dict[str, Any] | None = None,
                             name: str = CONFIGURATION_NAME, namespaces: list[str] | None = None) -> dict[str, Any]:
    """The configuration that sends SpecServing creates and updates to the webhook.

    Pass `url` (a webhook reachable from the apiserver by address, as on a local control plane) or `service`
    ({namespace, name, port}) for an in-cluster webhook. failurePolicy is Fail: with the webhook down, nothing
    that might crash a pool is admitted. `namespaces` limits it to those namespaces.
    """
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode("ascii")}
    if url is not None:
        client["url"] = f"{url.rstrip('/')}/{HANDLER_ID}"
    else:
        client["service"] = {**service, "path": f"/{HANDLER_ID}"}  # type: ignore[dict-item]
    hook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "clientConfig": client,
        "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "resources": [PLURAL],
                   "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
        "matchConditions": [{"name": "spec-changed", "expression": SPEC_CHANGED}],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }
    if namespaces:
        hook["namespaceSelector"] = {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "specserving"}},
        "webhooks": [hook],
    }
