"""The kopf side of the validating webhook: one handler that asks admission.review, and its counters."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter, Histogram

from specserving import GROUP, PLURAL, VERSION
from specserving.admission import refusal_message, review
from specserving.kube import Kube
from specserving.policy import ServingPolicy
from specserving.webhook.configuration import HANDLER_ID

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """kopf's read-only body views as plain dicts and lists, for the pure code."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class WebhookMetrics:
    """Admission reviews by operation and result, and how long each took."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reviews = Counter("specserving_webhook_reviews_total", "Admission reviews, by operation and result "
                               "(allowed, refused, error).", ["operation", "result"], registry=registry)
        self.seconds = Histogram("specserving_webhook_review_duration_seconds",
                                 "Time the webhook took to decide one review.", ["operation"],
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
                                 registry=registry)


def register(registry: kopf.OperatorRegistry, metrics: WebhookMetrics, policy: ServingPolicy | None = None,
             enforced_level: Callable[[str, Any], Awaitable[str | None]] | None = None) -> None:
    """Add the SpecServing validating handler to `registry`, refusing what `policy` forbids too, and warning when
    the namespace's Pod Security level (`await enforced_level(namespace, index)`, with the watch-fed index of
    namespace levels that this also registers) will refuse the pods."""

    @kopf.index("", "v1", "namespaces", id=NAMESPACE_LEVELS, registry=registry)
    async def index_namespace_level(*, name: str, labels: kopf.Labels, **_: Any) -> dict[str, str]:
        return {name: labels.get(ENFORCE_LABEL, "")}

    # Async, so the review runs on the event loop: a sync handler goes to kopf's thread pool and back, two GIL
    # hand-offs for a review of about half a millisecond, and reads the namespace index while the loop updates it.
    @kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"], registry=registry)
    async def validate_specserving(*, body: kopf.Body, warnings: list[str], old: kopf.Body | None = None,
                                   operation: str = "UNKNOWN", **kwargs: Any) -> None:
        # kopf passes old and operation to validating handlers, though its WebhookFn protocol does not list them.
        started = time.perf_counter()
        new_obj = plain(body)
        meta = new_obj.get("metadata", {})
        try:
            level = await enforced_level(str(meta.get("namespace") or "default"),
                                         kwargs.get(NAMESPACE_LEVELS)) if enforced_level else None
            report = review(new_obj, plain(old) if old is not None else None, policy=policy, enforced_level=level)
        except Exception:
            metrics.reviews.labels(operation, "error").inc()
            log.exception("admission review of SpecServing %s/%s failed unexpectedly", meta.get("namespace"),
                          meta.get("name"))
            raise kopf.AdmissionError(f"the SpecServing admission webhook failed on {meta.get('namespace')}/"
                                      f"{meta.get('name')}; see the operator's log", code=500) from None
        finally:
            metrics.seconds.labels(operation).observe(time.perf_counter() - started)
        warnings.extend(str(w) for w in report.warnings)
        if not report.ok:
            metrics.reviews.labels(operation, "refused").inc()
            raise kopf.AdmissionError(refusal_message(report), code=422)
        metrics.reviews.labels(operation, "allowed").inc()


ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
NAMESPACE_LEVELS = "namespace_levels"  # the kopf index: namespace name -> its enforce label ("" for none)


class NamespaceLevels:
    """The pod-security.kubernetes.io/enforce label of a namespace, from a watch of namespaces (a kopf index), as
    Kubernetes' own PodSecurity admission reads it from its informer: a label set before an apply is there once its
    watch event has arrived, milliseconds later. A namespace the index does not hold yet (just created, or the
    watch still listing) is read from the API server with `list` (the chart grants list and watch on namespaces,
    not get). Reading it once per review instead put an API request inside every review: 24 ms p50 and 455 ms p99
    of handler time at 100 reviews/s (bench, --profile: 28% of the webhook's samples waited in that request). A
    failed read gives None: the warning is advice, never a reason to refuse."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def __call__(self, namespace: str, index: Any = None) -> str | None:
        # On the event loop, as kopf's index updates are: the index cannot change under this read.
        known = next(iter(index[namespace]), "") if index is not None and namespace in index else None
        if known is not None:
            return str(known) or None
        try:
            found = await asyncio.to_thread(self.kube.request, "GET", "/api/v1/namespaces",
                                            query={"fieldSelector": f"metadata.name={namespace}"})
            items = found.get("items") or []
            level: str | None = ((items[0].get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL) \
                if items else None
        except Exception as exc:  # noqa: BLE001 - advice only: log and go on without it
            log.debug("cannot read the Pod Security level of namespace %s: %s", namespace, exc)
            return None
        return level
