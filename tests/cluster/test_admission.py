"""The validating webhook through real `kubectl apply`: the API server calls the operator's webhook over TLS.

Each test runs its own operator with the webhook in self mode, under a ValidatingWebhookConfiguration named
after the test namespace and limited to it, so no other test's SpecServings depend on this webhook.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserving.webhook.tls import generate

from .kube import Cluster, wait_for
from .operating import NAME, REPO, Operator, crd, free_port, seed

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
__all__ = ["crd"]  # a fixture, used by name

IB4 = [f"mlx5_{i}" for i in range(4)]


class WebhookOperator(Operator):
    def __init__(self, cluster: Cluster, namespace: str, log: Path) -> None:
        self.configuration = f"specserving-validating-{namespace}"
        self.webhook_port = free_port()
        super().__init__(cluster, namespace, log, extra=[
            "--webhook-port", str(self.webhook_port), "--webhook-listen", "127.0.0.1",
            "--webhook-cert-dir", str(log.parent / "webhook-tls"),
            "--webhook-configuration", "self", "--webhook-configuration-name", self.configuration])


@pytest.fixture
def webhook(cluster: Cluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[WebhookOperator]:
    op = WebhookOperator(cluster, namespace, tmp_path / "operator.log")
    try:
        # The configuration exists once the webhook serves: a refused object proves the whole path works.
        wait_for(lambda: cluster.get("validatingwebhookconfigurations", op.configuration) is not None, timeout=30,
                 what=f"ValidatingWebhookConfiguration {op.configuration}")
        wait_for(lambda: "admission webhook" in apply(cluster, namespace, seed(**{
            "spec.speculative.algorithm": "NGRAM"}), dry_run=True).stderr, timeout=30,
                 what="the webhook answering the API server")
        yield op
    finally:
        op.stop()
        cluster.kubectl("delete", "validatingwebhookconfiguration", op.configuration, "--ignore-not-found",
                        check=False)


def apply(cluster: Cluster, ns: str, obj: dict[str, Any], *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    args = ["apply", "-n", ns, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return cluster.kubectl(*args, input=yaml.safe_dump(obj), check=False)


def stored(cluster: Cluster, ns: str, name: str = NAME) -> bool:
    return cluster.get("specservings", name, ns) is not None


REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("ngram", {"spec.speculative.algorithm": "NGRAM"},
     ["spec.speculative.algorithm", "SGLang 0.5.17", "DFLASH, DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP"]),
    ("uno", {"spec.image.base": "lmsysorg/sglang:v0.5.23-cu129", "spec.speculative.algorithm": "UNO"},
     ["spec.speculative.algorithm", "SGLang 0.5.23", "UNO"]),
    ("standalone", {"spec.speculative.algorithm": "STANDALONE"}, ["spec.speculative.algorithm", "STANDALONE"]),
    ("dflash-0.5.18-without-fix", {"spec.image.base": "lmsysorg/sglang:v0.5.18-cu129",
                                   "spec.image.build": {"policy": "Never"}, "spec.engine.enableDpAttention": False,
                                   "spec.engine.dp": 1,
                                   "spec.speculative": {"algorithm": "DFLASH", "draftModelPath": "/data2/d"}},
     ["spec.speculative.algorithm", "SGLang 0.5.18", "build.policy to IfNeeded"]),
    ("dspark-0.5.16-without-fix", {"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129",
                                   "spec.image.build": {"policy": "Never"}},
     ["spec.speculative.algorithm", "SGLang 0.5.16", "DSPARK"]),
    ("dp-does-not-divide-tp", {"spec.engine.dp": 3}, ["spec.engine.dp", "got 8 and 3"]),
    ("ib-devices-do-not-match-gpus", {"spec.transfer.ibDevices": IB4}, ["spec.transfer.ibDevices", "8 GPUs"]),
    ("extra-args-set-an-owned-flag", {"spec.decode.extraArgs": ["--disaggregation-mode", "prefill"]},
     ["spec.decode.extraArgs[0]", "--disaggregation-mode"]),
    # Issue 19's classes, one real example each, through kubectl apply and the webhook.
    ("prefix-of-an-owned-flag", {"spec.decode.extraArgs": ["--disaggregation-mod", "prefill"]},
     ["spec.decode.extraArgs[0]", "sets --disaggregation-mode"]),
    ("prefix-bypassing-the-builder-check", {"spec.decode.extraArgs": ["--speculative-al", "NGRAM"]},
     ["spec.decode.extraArgs[0]", "sets --speculative-algorithm"]),
    ("typed-flag-overridden", {"spec.engine.extraArgs": ["--moe-a2a-backend", "deepep"]},
     ["spec.engine.extraArgs[0]", "spec.engine.moeA2aBackend"]),
    ("config-file", {"spec.engine.extraArgs": ["--config", "/etc/x.yaml"]}, ["spec.engine.extraArgs[0]", "--config"]),
    ("flag-removed-in-0.5.20", {"spec.image.base": "lmsysorg/sglang:v0.5.23-cu129",
                                "spec.decode.extraArgs": ["--cuda-graph-bs", "8"]},
     ["spec.decode.extraArgs[0]", "SGLang 0.5.23", "ambiguous option"]),
    ("unknown-flag", {"spec.decode.extraArgs": ["--no-such-flag"]}, ["spec.decode.extraArgs[0]", "no such option"]),
    ("pipeline-parallel", {"spec.decode.extraArgs": ["--pp-size", "2"]}, ["spec.decode.extraArgs[0]", "tp x pp"]),
    ("choice-of-a-later-version", {"spec.engine.toolCallParser": "deepseekv41"},
     ["spec.engine.toolCallParser", "invalid choice", "0.5.21"]),
    ("unknown-choice", {"spec.engine.moeRunnerBackend": "foo"}, ["spec.engine.moeRunnerBackend", "invalid choice"]),
    ("dp-without-dp-attention", {"spec.engine.enableDpAttention": False}, ["spec.engine.dp", "64 GPUs"]),
    # Found by running each release's ServerArgs on rendered lines (tests/decode_path/test_server_args.py).
    ("eagle-num-steps-without-topk", {"spec.speculative": {"algorithm": "EAGLE3", "draftModelPath": "/data2/d",
                                                           "numSteps": 3, "numDraftTokens": 4}},
     ["spec.speculative.eagleTopk", "Required value"]),
    ("dspark-window-not-block-size-plus-one", {"spec.speculative": {"algorithm": "DSPARK", "blockSize": 4,
                                                                    "numDraftTokens": 4}},
     ["spec.speculative.numDraftTokens", "blockSize + 1"]),
    ("name-starts-with-a-digit", {"metadata.name": "1dsv4"}, ["metadata.name", "DNS-1035"]),
    ("name-with-a-dot", {"metadata.name": "dsv4.flash"}, ["metadata.name", "DNS-1035"]),
    ("engine-port-is-the-bootstrap-port", {"spec.engine.port": 8998}, ["spec.engine.port", "same port"]),
    ("model-mounted-at-dev-shm", {"spec.model.volume.mountPath": "/dev/shm", "spec.model.path": "/dev/shm/m"},
     ["spec.model.volume.mountPath", "/dev/shm"]),
    ("operator-env-overridden", {"spec.decode.env": [{"name": "SGLANG_HOST_IP", "value": "1.2.3.4"}]},
     ["spec.decode.env[0].name", "SGLANG_HOST_IP"]),
    ("model-path-escapes-the-mount", {"spec.model.path": "/data2/../etc/x"}, ["spec.model.path", '".."']),
    ("model-path-beside-the-mount", {"spec.model.path": "/data2x/m"}, ["spec.model.path", "must lie below"]),
    ("two-devices-in-one-item", {"spec.transfer.ibDevices": ["mlx5_a,mlx5_b"] + [f"mlx5_{i}" for i in range(7)]},
     ["spec.transfer.ibDevices[0]"]),
    ("image-reference", {"spec.image.base": "Lmsysorg/SGLang:v0.5.17;x"}, ["spec.image.base", "image reference"]),
    ("limit-not-a-quantity", {"spec.router.resources": {"limits": {"memory": "abc"}}},
     ["spec.router.resources.limits.memory", "Kubernetes quantity"]),
    ("request-above-limit", {"spec.router.resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}},
     ["spec.router.resources.requests.cpu", "less than or equal to the cpu limit"]),
    ("fractional-tp", {"spec.engine.tp": 8.5}, ["spec.engine.tp"]),
    ("router-flag-prefix", {"spec.router.extraArgs": ["--polic", "random"]}, ["spec.router.extraArgs[0]", "--policy"]),
    ("node-selector-label-syntax", {"spec.decode.nodeSelector": {"gpu": "not valid!"}},
     ["spec.decode.nodeSelector[gpu]"]),
    # The serving-pod policy (the operator here allows hostPath below /data2 only, as the chart values the tests
    # install do): the node's root, its runtime socket folder and the kubelet's folder are refused by default.
    ("host-path-root", {"spec.model.volume.hostPath.path": "/"},
     ["spec.model.volume.hostPath.path", "servingPolicy.hostPathPrefixes"]),
    ("host-path-var-run", {"spec.model.volume.hostPath.path": "/var/run"},
     ["spec.model.volume.hostPath.path", "servingPolicy.hostPathPrefixes"]),
    ("host-path-kubelet", {"spec.model.volume.hostPath.path": "/var/lib/kubelet"},
     ["spec.model.volume.hostPath.path", "servingPolicy.hostPathPrefixes"]),
]


@pytest.mark.parametrize(("changes", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_at_apply_and_nothing_stored(cluster: Cluster, namespace: str, webhook: WebhookOperator,
                                             changes: dict[str, Any], words: list[str]) -> None:
    obj = seed(**changes)
    for dry_run in (True, False):
        out = apply(cluster, namespace, obj, dry_run=dry_run)
        assert out.returncode != 0, out.stdout
        for word in words:
            assert word in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        assert not stored(cluster, namespace, obj["metadata"]["name"])


def test_examples_are_accepted(cluster: Cluster, namespace: str, webhook: WebhookOperator) -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        obj = yaml.safe_load(example.read_text())
        for dry_run in (True, False):
            out = apply(cluster, namespace, obj, dry_run=dry_run)
            assert out.returncode == 0, f"{example.name}: {out.stderr}"
        assert stored(cluster, namespace, obj["metadata"]["name"])


def test_warnings_reach_kubectl(cluster: Cluster, namespace: str, webhook: WebhookOperator) -> None:
    out = apply(cluster, namespace, seed(**{"spec.prefill.speculativeDecoding": "Disabled"}))
    assert out.returncode == 0, out.stderr
    assert "Warning: spec.prefill.speculativeDecoding" in out.stderr
    out = apply(cluster, namespace, seed(**{"metadata.name": "untagged", "spec.image.base": "lmsysorg/sglang:latest"}))
    assert out.returncode == 0, out.stderr
    assert "Warning: spec.image.sglangVersion: cannot tell the SGLang version" in out.stderr


def test_a_contract_change_is_admitted_with_the_rollout_warning(cluster: Cluster, namespace: str,
                                                                webhook: WebhookOperator) -> None:
    assert apply(cluster, namespace, seed()).returncode == 0
    # Before revisions, a backend change of running pools was refused; now it rolls as a new revision.
    out = apply(cluster, namespace, seed(**{"spec.transfer.backend": "nixl"}))
    assert out.returncode == 0, out.stderr
    (warning,) = [ln for ln in out.stderr.splitlines() if "changes the PD contract" in ln]
    assert "spec.transfer" in warning and "rolls out as a new revision" in warning and "specserving plan" in warning
    obj = cluster.get("specservings", NAME, namespace)
    assert obj is not None and obj["spec"]["transfer"]["backend"] == "nixl"
    out = apply(cluster, namespace, seed(**{"spec.transfer.backend": "nixl", "spec.decode.replicas": 3}))
    assert out.returncode == 0 and "changes the PD contract" not in out.stderr  # a scale is no contract change


def test_webhook_outage_refuses_clearly_then_recovers(cluster: Cluster, namespace: str, webhook: WebhookOperator,
                                                      tmp_path: Path) -> None:
    webhook.stop()
    out = apply(cluster, namespace, seed())
    assert out.returncode != 0
    assert "failed calling webhook" in out.stderr and "validate.specservings.specserving.io" in out.stderr
    assert not stored(cluster, namespace)
    back = WebhookOperator(cluster, namespace, tmp_path / "operator-2.log")
    try:
        wait_for(lambda: apply(cluster, namespace, seed()).returncode == 0, timeout=30,
                 what="the SpecServing admitted once the webhook is back")
        assert stored(cluster, namespace)
    finally:
        back.stop()


def test_only_creates_and_spec_changes_reach_the_webhook(cluster: Cluster, namespace: str,
                                                      webhook: WebhookOperator) -> None:
    # The API server evaluates the configuration's matchConditions: with the webhook down and failing closed,
    # what it still sends is refused and what it no longer sends goes through.
    assert apply(cluster, namespace, seed()).returncode == 0
    webhook.stop()
    labelled = cluster.kubectl("label", "specserving", NAME, "-n", namespace, "team=serving", check=False)
    assert labelled.returncode == 0, labelled.stderr
    changed = apply(cluster, namespace, seed(**{"spec.decode.replicas": 3}))
    assert changed.returncode != 0 and "failed calling webhook" in changed.stderr, changed.stderr
    created = apply(cluster, namespace, seed(**{"metadata.name": "second"}))
    assert created.returncode != 0 and "failed calling webhook" in created.stderr, created.stderr


def test_a_namespace_whose_pod_security_level_refuses_the_pods_gets_a_warning(cluster: Cluster, namespace: str,
                                                                              webhook: WebhookOperator) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    out = apply(cluster, namespace, seed())
    assert out.returncode == 0, out.stderr  # advice, not a refusal: the admin may relabel the namespace
    assert f'Warning: metadata.namespace: namespace "{namespace}" enforces Pod Security level baseline, which will ' \
           "refuse the decode pods: they need privileged (hostNetwork=true" in out.stderr, out.stderr


def _tls_handshake(port: int, lowest: ssl.TLSVersion, highest: ssl.TLSVersion) -> str:
    """Connect with a client that offers exactly `lowest`..`highest`; the version the server picked."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client may offer old versions: only the server may refuse
    context.minimum_version, context.maximum_version = lowest, highest
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, context.wrap_socket(sock) as tls:
        return str(tls.version())


@contextlib.contextmanager
def _permissive_tls_server(directory: Path) -> Iterator[int]:
    """A TLS server that accepts every version this OpenSSL has: the control showing that the client above can
    really offer TLS 1.0 and 1.1, so that a refusal by the webhook is the webhook's."""
    material = generate(directory, ["localhost"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.load_cert_chain(str(material.certfile), str(material.keyfile))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _http_status(port: int, https: bool) -> int:
    """POST an empty review to the webhook's port; the HTTP status it answers."""
    if https:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                                                        context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/", body=b"{}", headers={"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_webhook_refuses_plain_http_and_tls_older_than_1_2(webhook: WebhookOperator, tmp_path: Path) -> None:
    port = webhook.webhook_port
    assert _http_status(port, https=True) >= 200  # the port answers HTTP over TLS: the refusals below are about TLS
    with pytest.raises((http.client.HTTPException, OSError)):
        status = _http_status(port, https=False)
        print(f"plain HTTP answered {status}")
    with warnings.catch_warnings(), _permissive_tls_server(tmp_path / "control-tls") as control:
        warnings.simplefilter("ignore", DeprecationWarning)  # offering TLS 1.0 and 1.1 is the point here
        for old, name in ((ssl.TLSVersion.TLSv1, "TLSv1"), (ssl.TLSVersion.TLSv1_1, "TLSv1.1")):
            assert _tls_handshake(control, old, old) == name  # the client can offer it
            with pytest.raises(ssl.SSLError):
                _tls_handshake(port, old, old)
    assert _tls_handshake(port, ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert _tls_handshake(port, ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.MAXIMUM_SUPPORTED) == "TLSv1.3"
    print(f"figure: webhook TLS: plain HTTP and TLS 1.0/1.1 refused (a control server accepted both from the same "
          f"client); 1.2 and 1.3 served ({ssl.OPENSSL_VERSION})")
