"""The converge passes' blocking work (API requests, planning) on a fixed pool of threads, the most urgent first.

Every pass runs at an urgency. A new or changed spec (kopf's create, update and resume handler: a `kubectl apply`,
a `kubectl scale`) is SPEC; a pass for a child, pod or build event is FOLLOW_UP; a resync is RESYNC; Kubernetes
Events are posted at BACKGROUND whatever the pass. With a thousand SpecServings applied at once, the calls of later
passes used to wait in one first-come queue (asyncio's default executor) behind the status writes, Events and pod
follow-ups of the ones before; here a new object's applies, or one SpecServing's scale, go ahead of all of those.
While spec calls wait or run, the other lanes share two of the eight threads, so a burst's status writes and Events
do not compete with its applies at the API server.

Within a lane, the calls of the pass that started first go first, then in the order they were made. A pass makes
its calls in steps (dry runs, then each wave of children, then the status), and every pass of a burst runs at once:
in a first-come queue each step went behind the steps every other pass had queued meanwhile, so all of a burst's
SpecServings got their children near its end. Oldest pass first, they get them in the order they came, as
kubectl's own applies do. A change to a SpecServing that already has children (a `kubectl scale`, a new spec)
goes ahead of the passes for new ones.

A pass waiting on its calls holds its SpecServing's lock. When a more urgent pass for the same SpecServing waits
for that lock (a scale arriving while a follow-up pass runs), `Ticket.raise_to` moves the waiting calls of the
running pass up, so the urgent one does not wait behind the backlog of the lower lane.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import heapq
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

WORKERS = 8  # below the API client's connection pool (10): a worker never waits for a connection
# While spec calls wait or run, the other lanes get at most this many threads: the API server, not the threads, is
# what a burst of new SpecServings runs short of (two cores here), so their status writes, Events and follow-ups
# are held back rather than sent beside the applies of the SpecServings still waiting for their children.
OTHERS_WHILE_SPEC = 2


class Urgency(enum.IntEnum):
    SPEC = 0
    FOLLOW_UP = 1
    RESYNC = 2
    BACKGROUND = 3


_ORDER = itertools.count()  # passes and calls, in the order they began


@dataclass(eq=False)
class Ticket:
    """The urgency of one pass, shared by every call it makes (asyncio tasks it starts inherit it), and its
    place among the passes of its lane: changes to running SpecServings first, then by age."""

    urgency: Urgency
    changes_running: bool = False
    waiting: dict[_Call, None] = field(default_factory=dict)  # in call order (an ordered set)
    order: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.order = (0 if self.changes_running else 1, next(_ORDER))

    def raise_to(self, urgency: Urgency) -> None:
        """A change to this pass's SpecServing waits for it: its waiting calls go to `urgency`, ahead of the
        passes for new SpecServings there."""
        if urgency < self.urgency:
            DISPATCHER.move(self, urgency)


@dataclass(eq=False)
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    context: contextvars.Context
    ticket: Ticket | None
    lane: Urgency
    place: tuple[int, int, int]  # its pass's order, then its own
    taken: bool = False


_CURRENT: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("specserving_pass_ticket", default=None)


@contextmanager
def running_at(ticket: Ticket) -> Iterator[Ticket]:
    """Within this block (and the tasks it starts), calls go at `ticket`'s urgency."""
    token = _CURRENT.set(ticket)
    try:
        yield ticket
    finally:
        _CURRENT.reset(token)


def current() -> Urgency:
    """The urgency calls made here would go at."""
    ticket = _CURRENT.get()
    return ticket.urgency if ticket is not None else Urgency.FOLLOW_UP


class Dispatcher:
    """A priority queue of calls and the threads that run them (started on first use, daemon threads)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._lanes: tuple[list[tuple[tuple[int, int, int], _Call]], ...] = tuple([] for _ in Urgency)  # heaps
        self._waiting = [0] * len(Urgency)
        self._running = [0] * len(Urgency)
        self._cond = threading.Condition()
        self._threads = 0
        self._idle = 0

    def waiting(self, urgency: Urgency) -> int:
        """Calls queued in one lane and not started (the queue depth the metrics export)."""
        return self._waiting[urgency]

    async def call(self, fn: Callable[..., T], *args: Any, urgency: Urgency | None = None) -> T:
        """Run `fn(*args)` on a worker thread, after every more urgent call queued before or after it."""
        ticket = _CURRENT.get() if urgency is None else None
        lane = urgency if urgency is not None else current()
        loop = asyncio.get_running_loop()
        number = next(_ORDER)
        place = (*ticket.order, number) if ticket is not None else (1, number, number)
        item = _Call(fn, args, loop.create_future(), loop, contextvars.copy_context(), ticket, lane, place)
        with self._cond:
            heapq.heappush(self._lanes[lane], (place, item))
            self._waiting[lane] += 1
            if ticket is not None:
                ticket.waiting[item] = None
            if self._idle > 0:
                self._idle -= 1  # counted here, not by the thread it wakes: two calls in a row wake two threads
                self._cond.notify()
            elif self._threads < self.workers:
                self._threads += 1
                threading.Thread(target=self._work, name=f"specserving-call-{self._threads}", daemon=True).start()
        result: T = await item.future
        return result

    def move(self, ticket: Ticket, urgency: Urgency) -> None:
        with self._cond:
            ticket.urgency = urgency
            ticket.order = (0, ticket.order[1])
            for item in ticket.waiting:
                if item.lane > urgency:
                    # The old entry stays in its lane and is skipped there: _take checks the lane it was filed in.
                    self._waiting[item.lane] -= 1
                    item.lane = urgency
                    item.place = (*ticket.order, item.place[2])
                    heapq.heappush(self._lanes[urgency], (item.place, item))
                    self._waiting[urgency] += 1

    def _held_back(self) -> bool:
        """The lanes below spec are at their share while spec calls wait or run."""
        spec = Urgency.SPEC
        return (self._waiting[spec] > 0 or self._running[spec] > 0) and \
            sum(self._running) - self._running[spec] >= OTHERS_WHILE_SPEC

    def _takeable(self) -> bool:
        return self._waiting[Urgency.SPEC] > 0 or (sum(self._waiting) > 0 and not self._held_back())

    def _take(self) -> _Call | None:
        for number, lane in enumerate(self._lanes):
            if number != Urgency.SPEC and self._held_back():
                return None
            while lane:
                _, item = heapq.heappop(lane)
                if item.taken or item.lane != number:
                    continue
                item.taken = True
                self._waiting[number] -= 1
                self._running[number] += 1
                if item.ticket is not None:
                    item.ticket.waiting.pop(item, None)
                return item
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._take()
                while item is None:
                    self._idle += 1
                    self._cond.wait()
                    item = self._take()
                if self._idle > 0 and self._takeable():  # more work than this thread: wake another
                    self._idle -= 1
                    self._cond.notify()
            try:
                result = item.context.run(item.fn, *item.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, which raises it
                _settle(item, None, exc)
            else:
                _settle(item, result, None)
            finally:
                with self._cond:
                    self._running[item.lane] -= 1


def _settle(item: _Call, result: Any, exc: BaseException | None) -> None:
    def done() -> None:
        if item.future.cancelled():
            return
        if exc is not None:
            item.future.set_exception(exc)
        else:
            item.future.set_result(result)

    try:
        item.loop.call_soon_threadsafe(done)
    except RuntimeError:
        pass  # the loop closed while the call ran (a test's loop, the operator stopping): nobody awaits it


DISPATCHER = Dispatcher()


async def call(fn: Callable[..., T], *args: Any, urgency: Urgency | None = None) -> T:
    """`await call(kube.apply, res, obj)`: the pass's urgency, unless `urgency` says otherwise."""
    return await DISPATCHER.call(fn, *args, urgency=urgency)
