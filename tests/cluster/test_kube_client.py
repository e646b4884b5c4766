"""The operator's API client against the real API server: its refusals, and answers asked for as metadata only."""

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


def test_writes_asked_for_metadata_only_answer_with_the_stored_version(cluster: Cluster, namespace: str) -> None:
    # The reconciler reads only resourceVersion and uid of an apply's answer and nothing of a status write's; it
    # asks the API server for PartialObjectMetadata so that the spec and status are neither sent nor decoded.
    kube = Kube(load_configuration(str(cluster.kubeconfig)))
    configmaps = kube.resource("v1", "ConfigMap")
    assert configmaps is not None
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "partial", "namespace": namespace},
                  "data": {"big": "x" * 10_000}}
    answer = kube.apply(configmaps, config_map, metadata_only=True)
    stored = kube.get(configmaps, namespace, "partial")
    assert answer["kind"] == "PartialObjectMetadata" and "data" not in answer, sorted(answer)
    assert answer["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert answer["metadata"]["uid"] == stored["metadata"]["uid"]
    assert kube.apply(configmaps, config_map)["data"] == config_map["data"]  # whole unless asked otherwise

    deployments = kube.resource("apps/v1", "Deployment")
    assert deployments is not None
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "partial", "namespace": namespace},
                  "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "partial"}},
                           "template": {"metadata": {"labels": {"app": "partial"}},
                                        "spec": {"containers": [{"name": "c", "image": "example.invalid/c"}]}}}}
    kube.apply(deployments, deployment)
    patched = kube.merge_patch(deployments, namespace, "partial", {"status": {"observedGeneration": 7}}, "status",
                               metadata_only=True)
    # (Not compared with a GET: the Deployment controller may write the status again in between.)
    assert patched["kind"] == "PartialObjectMetadata" and "status" not in patched, sorted(patched)
    assert patched["metadata"]["resourceVersion"]
