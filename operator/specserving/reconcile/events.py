"""Kubernetes events on a SpecServing: Warning for the reasons that call for attention, Normal otherwise.

A pass queues its Events and goes on, as client-go's recorder lets a Go controller do: an Event waits in the lowest
lane of reconcile/calls.py, behind every child and status call, and a pass that awaited it would hold its
SpecServing (and every later pass of it) until then. `flush` waits for the queued ones (at shutdown, in tests).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from specserving.kube import ApiError, Kube
from specserving.reconcile.calls import Urgency, call
from specserving.reconcile import reasons as R

log = logging.getLogger("specserving.reconcile")

# Events queued and not yet posted. Past the limit new ones are dropped (and said so in the log), as client-go's
# broadcaster drops when its queue is full: a burst of SpecServings must not grow the operator's memory without end.
PENDING_LIMIT = 5000
_pending: set[asyncio.Task[None]] = set()
_dropped = 0
# The last queued event of each SpecServing: the next one is posted after it, so `kubectl describe` lists one
# object's events in the order its passes queued them (the call lanes run on several threads).
_last: dict[tuple[str, str], asyncio.Task[None]] = {}


def post(kube: Kube, body: dict[str, Any], reason: str, message: str, warning: bool | None = None) -> None:
    """Queue one event on `body` and return at once; a refusal is logged, never raised (an event is never worth
    failing a pass for)."""
    global _dropped
    if len(_pending) >= PENDING_LIMIT:
        if _dropped == 0:
            log.warning("%d events wait to be posted; dropping new ones until they drain (first dropped: %s on %s)",
                        len(_pending), reason, body["metadata"]["name"])
        _dropped += 1
        return
    meta = body["metadata"]
    # Only what the Event names, not the whole body, waits in the queue.
    involved = {"apiVersion": body["apiVersion"], "kind": body["kind"],
                "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")}}
    warn = reason in R.WARNING_REASONS if warning is None else warning
    key = (meta["namespace"], meta["name"])
    task = asyncio.get_running_loop().create_task(_send(kube, involved, "Warning" if warn else "Normal", reason,
                                                        message, after=_last.get(key)))
    _pending.add(task)
    _last[key] = task
    task.add_done_callback(lambda done: _done(key, done))


def _done(key: tuple[str, str], task: asyncio.Task[None]) -> None:
    global _dropped
    _pending.discard(task)
    if _last.get(key) is task:
        del _last[key]
    if not _pending and _dropped:
        log.warning("events drained; %d were dropped while the queue was full", _dropped)
        _dropped = 0


async def _send(kube: Kube, involved: dict[str, Any], type_: str, reason: str, message: str,
                after: asyncio.Task[None] | None) -> None:
    if after is not None:
        await asyncio.wait([after])
    try:
        await call(kube.create_event, involved, type_, reason, message, urgency=Urgency.BACKGROUND)
    except ApiError as exc:
        # A namespace being deleted refuses new Events while its SpecServings are still being removed.
        (log.debug if exc.namespace_terminating else log.warning)(
            "cannot post event %s on %s: %s", reason, involved["metadata"]["name"], exc)
    except Exception:  # noqa: BLE001 - nobody awaits this task: say what failed rather than lose it
        log.exception("cannot post event %s on %s", reason, involved["metadata"]["name"])


def pending() -> int:
    """Events queued and not yet posted."""
    return len(_pending)


async def flush(timeout: float | None = None) -> None:
    """Wait for the events queued so far (at most `timeout` seconds)."""
    if _pending:
        await asyncio.wait(set(_pending), timeout=timeout)
