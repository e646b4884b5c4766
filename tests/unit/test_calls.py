"""The converge passes' calls run most urgent first (reconcile/calls.py), and a pass runs at the urgency of the most
urgent poke that asked for it (reconcile/queue.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from specserving.reconcile import calls
from specserving.reconcile.calls import Dispatcher, Ticket, Urgency, running_at
from specserving.reconcile.queue import WorkQueue
from specserving.reconcile.state import Key, OwnerState


async def _occupied(d: Dispatcher) -> tuple[threading.Event, asyncio.Future[Any]]:
    """The dispatcher's only worker, held until the returned gate is set."""
    gate = threading.Event()
    first = asyncio.ensure_future(d.call(gate.wait, 10))
    deadline = time.monotonic() + 5
    while d._threads == 0 or any(d.waiting(u) for u in Urgency):
        assert time.monotonic() < deadline, "the worker never took the first call"
        await asyncio.sleep(0.01)
    return gate, first


async def _step(d: Dispatcher, order: list[str], ticket: Ticket, name: str) -> None:
    """One call of the pass holding `ticket`: it records `name` when it runs."""
    with running_at(ticket):
        await d.call(order.append, name)


def test_calls_run_most_urgent_first_and_in_order_within_an_urgency() -> None:
    async def main() -> list[str]:
        d = Dispatcher(workers=1)
        gate, first = await _occupied(d)
        order: list[str] = []
        queued = [("resync", Urgency.RESYNC), ("event", Urgency.BACKGROUND), ("follow-1", Urgency.FOLLOW_UP),
                  ("apply", Urgency.SPEC), ("follow-2", Urgency.FOLLOW_UP)]
        tasks = [asyncio.ensure_future(d.call(order.append, name, urgency=u)) for name, u in queued]
        await asyncio.sleep(0.05)
        assert [d.waiting(u) for u in Urgency] == [1, 2, 1, 1]
        gate.set()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(main()) == ["apply", "follow-1", "follow-2", "resync", "event"]


def test_a_raised_ticket_moves_its_waiting_calls_ahead() -> None:
    async def main() -> list[str]:
        d = Dispatcher(workers=1)
        gate, first = await _occupied(d)
        order: list[str] = []
        slow = Ticket(Urgency.RESYNC)

        async def resync_pass() -> None:
            with running_at(slow):
                await asyncio.gather(d.call(order.append, "resync-a"), d.call(order.append, "resync-b"))

        other = asyncio.ensure_future(d.call(order.append, "someone else's follow-up", urgency=Urgency.FOLLOW_UP))
        mine = asyncio.ensure_future(resync_pass())
        await asyncio.sleep(0.05)
        d.move(slow, Urgency.SPEC)  # a scale arrived for the SpecServing whose resync pass holds the lock
        assert [d.waiting(u) for u in Urgency] == [2, 1, 0, 0]
        gate.set()
        await asyncio.gather(first, other, mine)
        return order

    assert asyncio.run(main()) == ["resync-a", "resync-b", "someone else's follow-up"]


def test_a_call_raises_what_its_function_raised() -> None:
    def refuse() -> None:
        raise ValueError("refused")

    async def main() -> None:
        with pytest.raises(ValueError, match="refused"):
            await Dispatcher(workers=2).call(refuse)

    asyncio.run(main())


def test_the_calls_of_a_pass_and_of_the_tasks_it_starts_go_at_its_urgency() -> None:
    async def main() -> list[Urgency]:
        seen: list[Urgency] = []

        async def child_task() -> None:
            seen.append(calls.current())

        with running_at(Ticket(Urgency.SPEC)):
            await asyncio.gather(child_task(), child_task())
        await child_task()
        return seen

    assert asyncio.run(main()) == [Urgency.SPEC, Urgency.SPEC, Urgency.FOLLOW_UP]


def test_a_pass_runs_at_the_most_urgent_poke_since_it_was_asked_for() -> None:
    states: dict[Key, OwnerState] = {}
    ran: list[Urgency] = []

    async def converge(key: Key, body: dict[str, Any]) -> str:
        ran.append(calls.current())
        return "applied"

    async def main() -> None:
        queue = WorkQueue(lambda key: {"metadata": {}}, lambda key: states.setdefault(key, OwnerState()), converge,
                          batch_seconds=0)
        queue.poke(("ns", "a"), Urgency.FOLLOW_UP)
        queue.poke(("ns", "a"), Urgency.RESYNC)  # a resync after a pod event does not make that pass wait longer
        queue.poke(("ns", "b"), Urgency.RESYNC)
        assert WorkQueue.queued(states.values()) == 2
        await asyncio.sleep(0.05)
        assert WorkQueue.queued(states.values()) == 0

    asyncio.run(main())
    assert ran == [Urgency.FOLLOW_UP, Urgency.RESYNC]


def test_while_spec_calls_run_the_other_lanes_share_two_threads() -> None:
    async def main() -> tuple[int, int]:
        d = Dispatcher(workers=4)
        spec_gate, others_gate = threading.Event(), threading.Event()
        started: list[str] = []

        def hold(name: str, gate: threading.Event) -> None:
            started.append(name)
            gate.wait(10)

        spec = asyncio.ensure_future(d.call(hold, "spec", spec_gate, urgency=Urgency.SPEC))
        others = [asyncio.ensure_future(d.call(hold, f"other-{i}", others_gate, urgency=u))
                  for i, u in enumerate([Urgency.FOLLOW_UP, Urgency.BACKGROUND, Urgency.RESYNC, Urgency.FOLLOW_UP])]
        await asyncio.sleep(0.3)
        while_spec = len(started) - 1
        spec_gate.set()
        await spec
        deadline = time.monotonic() + 5
        while len(started) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        after = len(started) - 1
        others_gate.set()
        await asyncio.gather(*others)
        return while_spec, after

    assert asyncio.run(main()) == (calls.OTHERS_WHILE_SPEC, 4)


def test_within_a_lane_the_older_pass_goes_first_and_a_change_to_a_running_one_before_both() -> None:
    async def main() -> list[str]:
        d = Dispatcher(workers=1)
        gate, first = await _occupied(d)
        order: list[str] = []
        older, newer = Ticket(Urgency.SPEC), Ticket(Urgency.SPEC)
        scale = Ticket(Urgency.SPEC, changes_running=True)

        # The newer pass queued its step first; the older one's next step (its second wave, say) comes after.
        tasks = [asyncio.ensure_future(_step(d, order, ticket, name))
                 for ticket, name in ((newer, "newer"), (older, "older"), (scale, "scale"))]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(main()) == ["scale", "older", "newer"]


def test_a_raised_pass_goes_ahead_of_older_passes_in_its_new_lane() -> None:
    async def main() -> list[str]:
        d = Dispatcher(workers=1)
        gate, first = await _occupied(d)
        order: list[str] = []
        new_object = Ticket(Urgency.SPEC)
        held = Ticket(Urgency.FOLLOW_UP)

        tasks = [asyncio.ensure_future(_step(d, order, new_object, "new object's apply")),
                 asyncio.ensure_future(_step(d, order, held, "follow-up of the scaled one"))]
        await asyncio.sleep(0.05)
        d.move(held, Urgency.SPEC)
        gate.set()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(main()) == ["follow-up of the scaled one", "new object's apply"]


def timed_queue(states: dict[Key, OwnerState], batch_seconds: float) -> tuple[WorkQueue, list[float]]:
    """A queue over `states` whose passes only record when they ran."""
    passes: list[float] = []

    async def converge(key: Key, body: dict[str, Any]) -> str:
        passes.append(time.monotonic())
        return "applied"

    return WorkQueue(lambda key: {"metadata": {}}, lambda key: states.setdefault(key, OwnerState()), converge,
                     batch_seconds=batch_seconds), passes


def test_pokes_within_the_batch_period_make_one_pass() -> None:
    queue, passes = timed_queue({}, batch_seconds=0.2)

    async def main() -> float:
        started = time.monotonic()
        queue.poke(("ns", "a"))
        await asyncio.sleep(0.05)
        assert passes == [], "a follow-up pass waits out the batch period"
        queue.poke(("ns", "a"), Urgency.RESYNC)  # a deployment, then its pod, then a resync ...
        queue.poke(("ns", "a"))
        await asyncio.sleep(0.4)
        return started

    started = asyncio.run(main())
    assert len(passes) == 1, "... make one pass"
    assert passes[0] - started >= 0.2


def test_a_ready_owners_pokes_are_not_batched() -> None:
    queue, passes = timed_queue({("ns", "a"): OwnerState(ready=True)}, batch_seconds=5)

    async def main() -> float:
        started = time.monotonic()
        queue.poke(("ns", "a"))  # its pod was lost
        await asyncio.sleep(0.1)
        return started

    started = asyncio.run(main())
    assert len(passes) == 1 and passes[0] - started < 0.1, "a serving SpecServing's pass waited out the batch"


def test_a_poke_asks_whether_the_owner_exists_without_decoding_it() -> None:
    states: dict[Key, OwnerState] = {}
    decoded: list[Key] = []

    def body_of(key: Key) -> dict[str, Any]:
        decoded.append(key)
        return {"metadata": {}}

    async def converge(key: Key, body: dict[str, Any]) -> str:
        return "applied"

    async def main() -> None:
        queue = WorkQueue(body_of, lambda key: states.setdefault(key, OwnerState()), converge,
                          exists=lambda key: key == ("ns", "a"), batch_seconds=0)
        for _ in range(5):
            queue.poke(("ns", "a"))
        queue.poke(("ns", "gone"))  # no longer watched: no pass
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert decoded == [("ns", "a")], "only the pass decodes its owner"
