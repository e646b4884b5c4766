"""Kubernetes events on a SpecServing: Warning for the reasons that call for attention, Normal otherwise."""

from __future__ import annotations

import logging
from typing import Any

from specserving.kube import ApiError, Kube
from specserving.reconcile.calls import Urgency, call
from specserving.reconcile import reasons as R

log = logging.getLogger("specserving.reconcile")


async def post(kube: Kube, body: dict[str, Any], reason: str, message: str, warning: bool | None = None) -> None:
    """Post one event, after every more urgent API call (reconcile/calls.py); a refusal is logged, never raised (an
    event is never worth failing a pass for)."""
    warn = reason in R.WARNING_REASONS if warning is None else warning
    try:
        await call(kube.create_event, body, "Warning" if warn else "Normal", reason, message,
                   urgency=Urgency.BACKGROUND)
    except ApiError as exc:
        # A namespace being deleted refuses new Events while its SpecServings are still being removed.
        (log.debug if exc.namespace_terminating else log.warning)(
            "cannot post event %s on %s: %s", reason, body["metadata"]["name"], exc)
