"""The operator's API client reads what the real API server says when it refuses a request."""

from __future__ import annotations

import json

import pytest
from specserving.kube import ApiError, Kube, load_configuration

from .kube import Cluster, wait_for

pytestmark = pytest.mark.cluster

SPS = {"apiVersion": "specserving.io/v1alpha1", "kind": "SpecServing"}
HOLD = "specserving.io/test-hold"  # a finalizer nobody serves: it keeps the namespace Terminating


def _event_error(kube: Kube, namespace: str) -> ApiError:
    involved = {**SPS, "metadata": {"name": "dsv4-flash", "namespace": namespace, "uid": "u-1"}}
    with pytest.raises(ApiError) as caught:
        kube.create_event(involved, "Normal", "Probe", "an event the API server must refuse")
    return caught.value


def test_a_terminating_namespace_is_told_apart_from_other_refusals(cluster: Cluster, namespace: str) -> None:
    kube = Kube(load_configuration(str(cluster.kubeconfig)))
    cluster.kubectl("create", "configmap", "hold", "-n", namespace)
    cluster.kubectl("patch", "configmap", "hold", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"metadata": {"finalizers": [HOLD]}}))
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    try:
        wait_for(lambda: (cluster.get("namespace", namespace) or {}).get("status", {}).get("phase") == "Terminating",
                 timeout=30, what=f"namespace {namespace} Terminating")
        refused = _event_error(kube, namespace)
        assert refused.status == 403 and refused.namespace_terminating, (refused, refused.causes)
        assert "being terminated" in refused.message
    finally:
        cluster.kubectl("patch", "configmap", "hold", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"metadata": {"finalizers": None}}), check=False)
    missing = _event_error(kube, f"{namespace}-never-made")
    assert missing.status == 404 and not missing.namespace_terminating, (missing, missing.causes)
