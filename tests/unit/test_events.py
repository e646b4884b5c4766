"""Events are queued by a pass and posted behind every more urgent call; the pass never waits for them."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from specserving.kube import ApiError
from specserving.reconcile import events
from specserving.reconcile import reasons as R

BODY = {"apiVersion": "specserving.io/v1alpha1", "kind": "SpecServing",
        "metadata": {"name": "dsv4-flash", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                     "managedFields": [{"manager": "kubectl"}]},
        "spec": {"model": {"path": "/data2/dsv4"}}}


class SlowKube:
    """create_event blocks until released, as a call stuck behind a backlog does."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.posted: list[tuple[dict[str, Any], str, str, str]] = []
        self.error = error

    def create_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        self.posted.append((involved, type_, reason, message))


def test_a_pass_goes_on_before_its_event_is_posted_and_flush_waits_for_it() -> None:
    kube = SlowKube()

    async def run() -> None:
        events.post(kube, BODY, R.CHILDREN_APPLIED, "applied generation 1")  # type: ignore[arg-type]
        events.post(kube, BODY, R.CHILD_APPLY_FAILED, "refused")  # type: ignore[arg-type]
        assert events.pending() == 2 and kube.posted == [], "post must not wait for the API call"
        kube.release.set()
        await events.flush(timeout=10)
        assert events.pending() == 0

    asyncio.run(run())
    assert [(t, r) for _, t, r, _ in kube.posted] == [("Normal", R.CHILDREN_APPLIED),
                                                      ("Warning", R.CHILD_APPLY_FAILED)], "in the order queued"
    involved = kube.posted[0][0]
    assert involved["metadata"] == {"name": "dsv4-flash", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"}
    assert "spec" not in involved, "only the reference waits in the queue, not the whole body"


def test_one_objects_events_are_posted_in_the_order_queued() -> None:
    kube = SlowKube()

    async def run() -> None:
        for i in range(12):
            events.post(kube, BODY, R.CHILDREN_APPLIED, f"pass {i}")  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # every call that can start has started and waits
        kube.release.set()
        await events.flush(timeout=10)

    asyncio.run(run())
    assert [m for _, _, _, m in kube.posted] == [f"pass {i}" for i in range(12)]


def test_a_refused_event_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    kube = SlowKube(ApiError(403, "Forbidden", "events is forbidden", "POST", "/api/v1/namespaces/ns/events"))
    kube.release.set()

    async def run() -> None:
        events.post(kube, BODY, R.CHILDREN_APPLIED, "applied")  # type: ignore[arg-type]
        await events.flush(timeout=10)

    with caplog.at_level(logging.WARNING, logger="specserving.reconcile"):
        asyncio.run(run())
    assert "cannot post event ChildrenApplied on dsv4-flash" in caplog.text


def test_past_the_limit_new_events_are_dropped_and_said_so(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(events, "PENDING_LIMIT", 3)
    kube = SlowKube()

    async def run() -> None:
        for i in range(5):
            events.post(kube, BODY, R.CHILDREN_APPLIED, f"applied {i}")  # type: ignore[arg-type]
        assert events.pending() == 3
        kube.release.set()
        await events.flush(timeout=10)

    with caplog.at_level(logging.WARNING, logger="specserving.reconcile"):
        asyncio.run(run())
    assert [m for _, _, _, m in kube.posted] == ["applied 0", "applied 1", "applied 2"]
    assert "dropping new ones" in caplog.text and "2 were dropped" in caplog.text
