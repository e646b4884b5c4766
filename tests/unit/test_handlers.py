"""kopf's create/update/resume handler turns the controller's verdicts into kopf's errors: an API outage mid-pass is
a TemporaryError (one log line, retried), anything unexpected reaches kopf as it is (logged with its traceback)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from specserving.kube import ApiError
from specserving.reconcile.errors import Blocked, Rejected
from specserving.reconcile.handlers import TRANSIENT_RETRY_SECONDS, build_registry


class Raising:
    """A controller whose pass raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def reconcile(self, key: Any, body: Any) -> str:
        raise self.error


def handle(error: Exception) -> None:
    reg = build_registry(Raising(error))  # type: ignore[arg-type]
    (handler,) = {h.fn for h in reg._changing.get_all_handlers() if h.id == "reconcile"}
    asyncio.run(handler(namespace="ns", name="x", body={}))


@pytest.mark.parametrize("status", [0, 409, 429, 500, 503])
def test_an_api_outage_mid_pass_is_retried_without_a_traceback(status: int) -> None:
    with pytest.raises(kopf.TemporaryError) as caught:
        handle(ApiError(status, "Unreachable", "Connection refused", "PATCH", "/apis/x"))
    assert caught.value.delay == TRANSIENT_RETRY_SECONDS


def test_an_unexpected_api_answer_reaches_kopf_as_it_is() -> None:
    with pytest.raises(ApiError):
        handle(ApiError(422, "Invalid", "status.conditions: bad", "PATCH", "/apis/x/status"))


def test_verdicts_become_kopf_errors() -> None:
    with pytest.raises(kopf.PermanentError, match="InvalidSpec"):
        handle(Rejected("spec.decode.replicas: must be at least 1"))
    with pytest.raises(kopf.TemporaryError):
        handle(Blocked("DependencyMissing", "install LeaderWorkerSet", retry=30.0))
    with pytest.raises(kopf.PermanentError):
        handle(Blocked("ImageLacksBuilder", "no builder", retry=None))
