"""Conditions in the Kubernetes API conventions' shape: build them, carry lastTransitionTime, find transitions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserving.reconcile.reasons import CONDITION_TYPES, DECODE_READY, PREFILL_READY, ROUTER_READY, WARNING_REASONS

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

# A pool coming up is a transition but not an Event: Ready's own rise says all of them did, in one Event rather than
# four (issue 21: a thousand new SpecServings posted 6,000 Events into the burst their children were created in). A
# pool going down is posted: that is where a user looks.
QUIET_RISES = frozenset({PREFILL_READY, DECODE_READY, ROUTER_READY})


def condition(type_: str, status: str, reason: str, message: str, generation: int) -> dict[str, Any]:
    """One condition without lastTransitionTime (merge() sets it)."""
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation}


def merge(old: list[dict[str, Any]] | None, new: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """`new` in the canonical order, each with lastTransitionTime kept from `old` unless its status changed."""
    previous = {c.get("type"): c for c in old or []}
    merged = []
    for c in sorted(new, key=lambda c: CONDITION_TYPES.index(c["type"])):
        before = previous.get(c["type"]) or {}
        kept = before.get("lastTransitionTime") if before.get("status") == c["status"] else None
        merged.append({**c, "lastTransitionTime": kept or now})
    return merged


@dataclass(frozen=True, slots=True)
class Transition:
    """A condition change worth a Kubernetes event."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        return self.reason in WARNING_REASONS

    @property
    def quiet(self) -> bool:
        """Remembered as posted, so that the next fall is posted, but not posted as an Event (QUIET_RISES)."""
        return self.status == TRUE and self.type in QUIET_RISES


def transitions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[Transition]:
    """Conditions whose status changed, or that newly carry bad news (a warning reason)."""
    previous = {c.get("type"): c for c in old or []}
    found = []
    for c in new:
        before = previous.get(c["type"])
        changed = before is not None and before.get("status") != c["status"] and c["status"] != UNKNOWN
        new_bad_news = c["reason"] in WARNING_REASONS and (before is None or before.get("reason") != c["reason"])
        if changed or new_bad_news:
            found.append(Transition(c["type"], c["status"], c["reason"], c["message"]))
    return found


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
