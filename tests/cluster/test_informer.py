"""The operator's informer against the real API server: list, watch, deletion, a kind the cluster does not serve
(the expired resourceVersion's relist is a unit test: a fresh API server has compacted nothing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from specserving.kube import Kube, load_configuration
from specserving.reconcile.informer import Informers, Source

from .kube import Cluster

pytestmark = pytest.mark.cluster

OWNER = "specserving.io/instance"


def _summary(body: dict[str, Any]) -> tuple[tuple[str, str], Any] | None:
    meta = body["metadata"]
    owner = (meta.get("labels") or {}).get(OWNER)
    return ((meta["namespace"], owner), (meta["name"], (body.get("data") or {}).get("v"))) if owner else None


async def _until(what: str, check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _configmap(cluster: Cluster, namespace: str, name: str, owner: str, value: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "namespace": namespace, "labels": {OWNER: owner}}, "data": {"v": value}})


def test_the_store_follows_list_watch_and_deletion(cluster: Cluster, namespace: str) -> None:
    kube = Kube(load_configuration(str(cluster.kubeconfig)))
    _configmap(cluster, namespace, "before", "a", "1")
    cluster.kubectl("create", "configmap", "unlabelled", "-n", namespace)
    seen: list[tuple[tuple[str, str], Any, bool]] = []

    async def scenario() -> None:
        informers = Informers()
        informers.add("configmaps", kube, [Source("configmaps", f"/api/v1/namespaces/{namespace}/configmaps", OWNER,
                                                  namespace)], _summary, lambda *change: seen.append(change))
        view = informers.view("configmaps")
        informers.start()
        try:
            await asyncio.wait_for(informers.wait_synced(), 20)
            assert {k: sorted(v) for k, v in view.items()} == {(namespace, "a"): [("before", "1")]}
            await asyncio.to_thread(_configmap, cluster, namespace, "after", "b", "2")
            await _until("the new object", lambda: (namespace, "b") in view)
            await asyncio.to_thread(_configmap, cluster, namespace, "after", "b", "3")
            await _until("its change", lambda: list(view.get((namespace, "b"), ())) == [("after", "3")])
            await asyncio.to_thread(_configmap, cluster, namespace, "before", "b", "4")  # moved to another owner
            await _until("the move", lambda: (namespace, "a") not in view and len(view[(namespace, "b")]) == 2)
            await asyncio.to_thread(cluster.kubectl, "delete", "configmap", "after", "-n", namespace)
            await _until("the deletion", lambda: list(view.get((namespace, "b"), ())) == [("before", "4")])
        finally:
            informers.stop()

    asyncio.run(scenario())
    assert ((namespace, "a"), ("before", "1"), True) in seen  # the move told the old owner
    assert seen[-1] == ((namespace, "b"), ("after", "3"), True), seen[-3:]
    assert not any(summary[0] == "unlabelled" for _, summary, _ in seen)


def test_a_kind_the_cluster_does_not_serve_lists_as_empty(cluster: Cluster) -> None:
    # A 404 from the real API server for a group nobody serves: the informer counts as listed (passes go on; they
    # say the CRD is missing) and marks the kind missing, to be listed again once a pass finds it served.
    kube = Kube(load_configuration(str(cluster.kubeconfig)))

    async def scenario() -> bool:
        informers = Informers()
        informers.add("widgets", kube, [Source("widgets", "/apis/example.invalid/v1/widgets", OWNER)],
                      _summary, lambda *change: None)
        informers.start()
        try:
            await asyncio.wait_for(informers.wait_synced(), 20)
            return informers.by_kind["widgets"][0].missing
        finally:
            informers.stop()

    assert asyncio.run(scenario())
