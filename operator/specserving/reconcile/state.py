"""What the operator remembers about one SpecServing between passes (per process; rebuilt on restart)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from specserving.reconcile.calls import Ticket, Urgency
from specserving.reconcile.observed import ChildRef
from specserving.reconcile.packed import Rendering
from specserving.reconcile.plan import Plan
from specserving.rollout import Decision

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class RolloutState:
    """The last pass's rollout decision, for the status report."""

    target: str
    decision: Decision
    strategy: str


@dataclass(slots=True)
class Applied:
    """A child as we last applied it: the rendering's digest and the API server's answer."""

    digest: str
    resource_version: str
    uid: str = ""


@dataclass(slots=True)
class OwnerState:
    """One SpecServing's memory: the work queue's fields first, then the converge pass's."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    draining: bool = False
    retry: asyncio.TimerHandle | None = None
    failures: int = 0
    # The most urgent poke since the pending pass was asked for, and the running pass's ticket (reconcile/calls.py).
    urgency: Urgency = Urgency.BACKGROUND
    ticket: Ticket | None = None
    # The last pass found it Ready: its poked passes run at once rather than after queue.BATCH_SECONDS, so a pod
    # lost from a serving SpecServing shows in its status even when kwok (or a warm node) replaces it within it.
    ready: bool = False
    plan: Plan | None = None
    applied: dict[ChildRef, Applied] = field(default_factory=dict)
    # The uid of the last deletion the watch showed per child: an object we applied that is already gone must be
    # applied again, even when its DELETED event came before our apply call returned.
    deleted: dict[ChildRef, str] = field(default_factory=dict)
    applied_generation: int | None = None
    # The status before (its packed.fingerprint) and after our last write (packed, and the dictionary it was packed
    # against: compact.py), to tell a stale watch view from a fresh one; None once the watch has shown a status
    # other than the one before the write. Packed, as a burst leaves every SpecServing holding one.
    written: tuple[bytes, bytes, bytes] | None = None
    # The last (status, reason) posted as an event per condition type, so no transition is posted twice.
    posted: dict[str, tuple[str, str]] = field(default_factory=dict)
    rollout: RolloutState | None = None
    # The rendering the API server's dry run last accepted whole: a new one is dry-run before anything is applied.
    dry_run_passed: Rendering | None = None
    # The last rollout step posted as an event: (target, step, description).
    rollout_posted: tuple[str, str, str] | None = None
