"""The webhook's pure parts: review on create and update, its TLS material, its configuration object."""

from __future__ import annotations

import base64
import re
import ssl
from pathlib import Path

import yaml
from cryptography import x509

from specserving.admission import refusal_message, review
from specserving.webhook.configuration import HANDLER_ID, SPEC_CHANGED, validating_configuration
from specserving.webhook.tls import generate

from .builders import ROOT, seed


def test_create_refusal_names_every_problem() -> None:
    report = review(seed(**{"spec.speculative.algorithm": "NGRAM", "spec.decode.extraArgs": ["--host", "x"]}), None)
    msg = refusal_message(report)
    assert msg.startswith("SpecServing refused (2 problems): ")
    assert "spec.speculative.algorithm" in msg and "spec.decode.extraArgs[0]" in msg


def test_a_shape_that_got_past_the_apiserver_is_refused_with_the_schema_error_not_a_crash() -> None:
    # The apiserver checks the schema before the webhook; under validation ratcheting an update may still carry a
    # field the installed CRD no longer admits. The rules cannot read it, so the review falls back to the schema.
    report = review(seed(**{"spec.model": 5}), seed())
    assert not report.ok
    assert [e.path for e in report.errors] == ["spec.model"], report.errors


def test_create_warnings_are_returned() -> None:
    report = review(seed(**{"spec.prefill.speculativeDecoding": "Disabled"}), None)
    assert report.ok and report.warnings


def test_update_of_the_algorithm_is_allowed_with_a_rollout_warning() -> None:
    report = review(seed(**{"spec.speculative.algorithm": "EAGLE"}), seed())
    assert report.ok
    (warning,) = [w for w in report.warnings if w.path == "spec"]
    assert "changes the PD contract (spec.speculative)" in warning.message
    assert "rolls out as a new revision" in warning.message and "Surge" in warning.message


def test_update_of_the_transfer_backend_while_running_rolls_as_a_new_revision() -> None:
    report = review(seed(**{"spec.transfer.backend": "nixl"}), seed())
    assert report.ok, report.errors
    assert any("spec.transfer" in w.message and "new revision" in w.message for w in report.warnings)


def test_switching_a_running_pool_between_deployment_and_leaderworkerset_rolls_as_a_new_revision() -> None:
    new = seed(**{"spec.decode.nodesPerReplica": 2, "spec.prefill.nodesPerReplica": 2,
                  "spec.transfer.ibDevices": [f"mlx5_{i}" for i in range(4)]})
    report = review(new, seed())
    assert report.ok, report.errors
    (warning,) = [w for w in report.warnings if w.path == "spec"]
    assert "spec.decode.nodesPerReplica" in warning.message and "spec.prefill.nodesPerReplica" in warning.message


def test_a_change_outside_the_contract_gets_no_rollout_warning() -> None:
    report = review(seed(**{"spec.decode.replicas": 5, "spec.router.policy": "round_robin"}), seed())
    assert report.ok and not [w for w in report.warnings if w.path == "spec"]


def test_update_to_a_crashing_algorithm_is_refused() -> None:
    report = review(seed(**{"spec.speculative.algorithm": "UNO"}), seed())
    assert [e.path for e in report.errors] == ["spec.speculative.algorithm"]


def test_tls_material_is_a_ca_signed_server_certificate(tmp_path: Path) -> None:
    material = generate(tmp_path / "certs", ["127.0.0.1", "localhost"])
    assert oct(material.keyfile.stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate(material.certfile.read_bytes())
    ca = x509.load_pem_x509_certificate(material.ca_pem)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    # The files load as a server context, as kopf's WebhookServer will load them.
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(material.certfile, material.keyfile)


def test_configuration_fails_closed_with_a_short_timeout_on_our_resource_only() -> None:
    cfg = validating_configuration(b"PEM", url="https://127.0.0.1:9443/")
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] <= 10
    assert hook["sideEffects"] == "None"
    assert hook["rules"] == [{"apiGroups": ["specserving.io"], "apiVersions": ["v1alpha1"],
                              "resources": ["specservings"], "operations": ["CREATE", "UPDATE"],
                              "scope": "Namespaced"}]
    assert hook["clientConfig"]["url"] == f"https://127.0.0.1:9443/{HANDLER_ID}"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"


def test_only_creates_and_spec_changes_are_sent_by_the_configuration_and_the_chart_alike() -> None:
    (hook,) = validating_configuration(b"PEM", url="https://127.0.0.1:9443/")["webhooks"]
    assert hook["matchConditions"] == [{"name": "spec-changed", "expression": SPEC_CHANGED}]
    # The chart's template is Go-templated YAML: its lines for the condition, read as YAML on their own.
    template = (ROOT / "charts/specserving-operator/templates/webhook.yaml").read_text()
    found = re.search(r"^  matchConditions:\n(?:  [-\s].*\n)+", template, re.MULTILINE)
    assert found, "the chart's ValidatingWebhookConfiguration has no matchConditions"
    assert yaml.safe_load(found.group(0))["matchConditions"] == hook["matchConditions"]


def test_configuration_for_an_in_cluster_service() -> None:
    cfg = validating_configuration(b"PEM", service={"namespace": "ops", "name": "specserving-webhook",
                                                    "port": 443})
    assert cfg["webhooks"][0]["clientConfig"]["service"] == {"namespace": "ops", "name": "specserving-webhook",
                                                             "port": 443, "path": f"/{HANDLER_ID}"}
