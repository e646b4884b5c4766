"""Failing pool pods: CrashLoopBackOff, containers terminated with an error, image pulls that fail, Failed pods.

The message carries the container's last termination reason and message, so the Degraded condition shows the
line a user needs (`AttributeError: 'NoneType' object has no attribute 'prepare_for_decode'`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specserving.reconcile import reasons as R
from specserving.reconcile.observed import ContainerState, Pod, Termination
from specserving.rendering import labels as L

ROLE_ORDER = (L.PREFILL, L.DECODE, L.ROUTER)
IMAGE_PULL = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
MESSAGE_TAIL = 2000  # termination messages hold the log tail; the end is what explains the crash


@dataclass(frozen=True)
class Failure:
    """One failing pod, the reason category and a sentence that names pod, container and cause."""

    role: str
    pod: str
    reason: str
    message: str


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_TAIL else "..." + text[-MESSAGE_TAIL:]


def _termination(t: Termination) -> str:
    what = f"{t.reason or 'terminated'} (exit code {t.exit_code})"
    return f"{what}: {_tail(t.message)}" if t.message else what


def _container_failure(c: ContainerState) -> tuple[str, str] | None:
    restarts = f"after {c.restarts} restart{'s' if c.restarts != 1 else ''}"
    if c.waiting_reason == "CrashLoopBackOff":
        last = f"; last terminated: {_termination(c.last_terminated)}" if c.last_terminated else ""
        return R.CRASH_LOOP_BACK_OFF, f"container {c.name} is in CrashLoopBackOff {restarts}{last}"
    if c.terminated and c.terminated.exit_code != 0:
        return R.CONTAINER_FAILED, f"container {c.name} terminated with {_termination(c.terminated)}"
    if c.waiting_reason in IMAGE_PULL:
        return R.IMAGE_PULL_FAILED, f"container {c.name} cannot pull its image: {c.waiting_reason}" + (
            f": {c.waiting_message}" if c.waiting_message else "")
    if c.waiting_reason in CONFIG_ERRORS:
        return R.CONTAINER_FAILED, f"container {c.name} cannot start: {c.waiting_reason}" + (
            f": {c.waiting_message}" if c.waiting_message else "")
    return None


def pod_failures(pods: Iterable[Pod]) -> list[Failure]:
    """Every failing pod that is not being deleted, prefill first, then decode and router, by name."""
    found = []
    for pod in sorted(pods, key=lambda p: (ROLE_ORDER.index(p.role) if p.role in ROLE_ORDER else 9, p.name)):
        if pod.deleting:
            continue
        if pod.phase == "Failed":
            detail = ": ".join(x for x in (pod.reason, pod.message) if x) or "the pod failed"
            found.append(Failure(pod.role, pod.name, R.POD_FAILED, f"{pod.role} pod {pod.name} failed: {detail}"))
            continue
        for c in pod.containers:
            failed = _container_failure(c)
            if failed:
                found.append(Failure(pod.role, pod.name, failed[0], f"{pod.role} pod {pod.name}: {failed[1]}"))
                break
    return found


def summary(failures: list[Failure]) -> str:
    """The first failure in full, then a count of the others by pool."""
    first, rest = failures[0], failures[1:]
    if not rest:
        return first.message
    by_role: dict[str, int] = {}
    for f in rest:
        by_role[f.role] = by_role.get(f.role, 0) + 1
    counts = ", ".join(f"{n} {role}" for role, n in by_role.items())
    return f"{first.message}; and {len(rest)} more failing pod{'s' if len(rest) > 1 else ''} ({counts})"
