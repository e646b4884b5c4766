"""The work queue: events for one SpecServing coalesce into one more pass, passes for it run one at a time, and a
failed pass is retried with backoff. kopf's own handler retries cover only its handlers; child and pod events,
build events and the resync come through here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from specserving.reconcile.calls import Ticket, Urgency, running_at
from specserving.reconcile.errors import Blocked, Rejected
from specserving.reconcile.state import Key, OwnerState

log = logging.getLogger("specserving.reconcile")

MAX_BACKOFF_SECONDS = 60.0
# While a SpecServing comes up, a follow-up or resync pass waits this long after the poke that asked for it, so the
# events its pools set off (three Deployments, ReplicaSets and pods each moving a step) make one pass and one
# status write rather than one each: kube-controller-manager's --endpointslice-updates-batch-period, for the same
# reason. Once it is Ready, passes run at once: a pool losing a pod is news to report, not to batch. A new or
# changed spec (kopf's handler) never waits.
BATCH_SECONDS = 0.25

Converge = Callable[[Key, dict[str, Any]], Awaitable[str]]


class WorkQueue:
    """Runs `converge(key, body)` for the latest body `body_of(key)` whenever a SpecServing is poked.

    `exists(key)` answers whether a poke is worth a pass without decoding the body (every child and pod event, and
    every resync, pokes; decoding the owner on each was a tenth of the operator's CPU in issue 21's N=200 profile)."""

    def __init__(self, body_of: Callable[[Key], dict[str, Any] | None], state_of: Callable[[Key], OwnerState],
                 converge: Converge, exists: Callable[[Key], bool] | None = None,
                 batch_seconds: float = BATCH_SECONDS) -> None:
        self.body_of, self.state_of, self.converge = body_of, state_of, converge
        self.batch_seconds = batch_seconds
        self.exists = exists or (lambda key: body_of(key) is not None)

    def poke(self, key: Key, urgency: Urgency = Urgency.FOLLOW_UP) -> None:
        """Something about this SpecServing changed (a child, a pod, a resync): converge soon, once, at the most
        urgent of the pokes since."""
        if not self.exists(key):
            return
        st = self.state_of(key)
        st.dirty = True
        st.urgency = min(st.urgency, urgency)
        if not st.draining:
            st.draining = True
            asyncio.get_running_loop().create_task(self._drain(key, st))

    async def _drain(self, key: Key, st: OwnerState) -> None:
        try:
            while st.dirty:
                if self.batch_seconds > 0 and not st.ready:
                    await asyncio.sleep(self.batch_seconds)  # later pokes join this pass
                # The lock is taken per pass, not across the loop: the kopf handler of this SpecServing waits on
                # it, and kopf updates this SpecServing's index entry (a new generation, its deletion) only after
                # that handler returns. Held across passes that pokes keep renewing (resyncs, pod and child events),
                # it starved the handler, so passes went on with a stale body, or for an owner already deleted.
                async with st.lock:
                    st.dirty = False
                    body = self.body_of(key)
                    if body is None:
                        return
                    st.ticket, st.urgency = Ticket(st.urgency), Urgency.BACKGROUND
                    try:
                        with running_at(st.ticket):
                            await self.converge(key, body)
                        st.failures = 0
                    except Rejected:
                        pass
                    except Blocked as exc:
                        if exc.retry:
                            self.retry_later(key, st, exc.retry)
                    except Exception as exc:  # noqa: BLE001 - retried with backoff, never lost
                        st.failures += 1
                        delay = min(MAX_BACKOFF_SECONDS, 2.0 ** st.failures)
                        log.warning("%s/%s: converge failed (retry in %.0fs): %s", *key, delay, exc)
                        self.retry_later(key, st, delay)
                    finally:
                        st.ticket = None
        finally:
            st.draining = False

    @staticmethod
    def queued(states: Iterable[OwnerState]) -> int:
        """SpecServings with a pass asked for and not started (the work queue's depth)."""
        return sum(1 for st in states if st.dirty)

    def retry_later(self, key: Key, st: OwnerState, delay: float) -> None:
        if st.retry is not None:
            st.retry.cancel()
        st.retry = asyncio.get_running_loop().call_later(delay, self.poke, key)

    @staticmethod
    def cancel(st: OwnerState) -> None:
        if st.retry is not None:
            st.retry.cancel()
