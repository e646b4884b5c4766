"""`python -m specserving.selftest --namespace NS`: prove that the admission webhook guards SpecServings.

The Helm chart's `helm test` Pod runs it. It asks the API server for a server-side dry-run create of a SpecServing
whose speculative algorithm (NGRAM) has a PD-decode draft-input builder in no SGLang version, so the webhook must
refuse it. Exit 0 only when the refusal comes from our webhook and names spec.speculative.algorithm; otherwise
print one line saying what happened instead and exit 1. A dry run stores nothing.

Credentials: --kubeconfig, else $KUBECONFIG, else the Pod's service account (in-cluster).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import urllib.parse
from typing import Any

from specserving import API_VERSION, KIND, PLURAL
from specserving.kube import ApiError, Kube, StartupError, load_configuration
from specserving.webhook.configuration import WEBHOOK_NAME

FIELD = "spec.speculative.algorithm"
ALGORITHM = "NGRAM"
NAME = "specserving-selftest"


def probe(namespace: str) -> dict[str, Any]:
    """A SpecServing that passes the CRD's schema and CEL rules, so that only the webhook can refuse it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {"path": "/models/selftest"},
            "image": {"base": "lmsysorg/sglang:v0.5.17-cu129"},
            "speculative": {"algorithm": ALGORITHM},
        },
    }


def _message(exc: ApiError) -> str:
    """The Status message of an error answer (the client may hand over the whole JSON body)."""
    try:
        body = json.loads(exc.message)
    except ValueError:
        return exc.message
    return str(body.get("message", exc.message)) if isinstance(body, dict) else exc.message


def check(kube: Kube, namespace: str) -> tuple[bool, str]:
    """(passed, the line to print) for one dry-run create in `namespace`."""
    path = f"/apis/{API_VERSION}/namespaces/{urllib.parse.quote(namespace)}/{PLURAL}"
    try:
        kube.request("POST", path, query={"dryRun": "All"}, body=probe(namespace), content_type="application/json")
    except ApiError as exc:
        message = _message(exc)
        if exc.status == 0:
            return False, f"cannot reach the API server at {kube.host}: {message}"
        if WEBHOOK_NAME in message and "denied the request" in message and FIELD in message:
            return True, f"ok: the webhook refused {ALGORITHM} in namespace {namespace}: {message}"
        if "failed calling webhook" in message:
            return False, f"the API server could not call the webhook {WEBHOOK_NAME}: {message}"
        return False, (f"the dry run was refused ({exc.status} {exc.reason}), but not by the webhook for "
                       f"{FIELD}: {message}")
    return False, (f"the API server admitted a SpecServing with {FIELD} {ALGORITHM} in namespace {namespace} "
                   f"(dry run): no validating webhook {WEBHOOK_NAME} covers it; check the "
                   f"ValidatingWebhookConfiguration and its namespaceSelector")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserving.selftest", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--namespace", required=True, help="namespace to dry-run the SpecServing in")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    args = parser.parse_args(argv)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # one line from us, not the client's retry warnings
    try:
        passed, line = check(Kube(load_configuration(args.kubeconfig)), args.namespace)
    except StartupError as exc:
        passed, line = False, str(exc)
    print(line if passed else f"selftest failed: {line}", file=sys.stdout if passed else sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
