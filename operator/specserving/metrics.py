"""The operator's Prometheus metrics (prometheus-client), served by `specserving run --metrics-port`.

Names follow Prometheus conventions: the specserving_ prefix, _total for counters, _seconds for durations.
`Metrics` owns its collectors on a registry of its choice, so tests can make as many as they like.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from specserving.api.status import PHASES

# Results of one reconcile (the `result` label).
APPLIED = "applied"  # children applied or already matching, status up to date
REJECTED = "rejected"  # the spec is invalid: no children
BLOCKED = "blocked"  # a dependency is missing or the image cannot run the spec
ERROR = "error"  # an API or programming error; retried with backoff
RESULTS = (APPLIED, REJECTED, BLOCKED, ERROR)


class Metrics:
    """Every collector the operator exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else REGISTRY
        r = self.registry
        self.reconciles = Counter("specserving_reconcile_total", "Reconciles of a SpecServing, by result.",
                                  ["result"], registry=r)
        self.reconcile_seconds = Histogram(
            "specserving_reconcile_duration_seconds", "Time one reconcile took, by result.", ["result"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.reconcile_errors = Counter("specserving_reconcile_errors_total",
                                        "Reconciles that failed, by reason (a condition reason or the error type).",
                                        ["reason"], registry=r)
        self.specservings = Gauge("specserving_specservings", "SpecServings this operator watches, by phase.",
                                  ["phase"], registry=r)
        self.api_requests = Counter("specserving_api_requests_total",
                                    "Requests the operator made to the API server (kopf's watches excluded), "
                                    "by verb, resource and HTTP status.", ["verb", "resource", "code"], registry=r)
        self.child_applies = Counter("specserving_child_applies_total",
                                     "Server-side applies of children, by kind and whether they changed the object.",
                                     ["kind", "result"], registry=r)
        self.status_writes = Counter("specserving_status_writes_total", "Writes of a SpecServing's status.",
                                     registry=r)
        self.builds = Counter("specserving_builds_total",
                              "Fixed-image build Jobs: started (created by this process), succeeded and failed "
                              "(ended while this process watched).", ["result"], registry=r)
        self.build_seconds = Histogram(
            "specserving_build_duration_seconds", "How long build Jobs ran, start to end, by outcome.", ["result"],
            buckets=(30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 10800), registry=r)
        # Set by the controller to read its queues at scrape time (reconcile/calls.py, reconcile/queue.py).
        self.calls_waiting = Gauge("specserving_api_calls_waiting",
                                   "API calls queued and not started, by the urgency of the pass that made them "
                                   "(spec, follow_up, resync, background).", ["urgency"], registry=r)
        self.passes_queued = Gauge("specserving_passes_queued",
                                   "SpecServings waiting for a converge pass (asked for, not started).", registry=r)
        self._phases: dict[tuple[str, str], str] = {}
        self._phase_counts: collections.Counter[str] = collections.Counter()
        # The pools of each SpecServing, (ready, desired) per pool: read by PoolGauges when scraped.
        self._pools: dict[tuple[str, str], dict[str, tuple[int, int | None]]] = {}
        r.register(PoolGauges(self._pools))
        for phase in PHASES:
            self.specservings.labels(phase).set(0)
        for result in ("started", "succeeded", "failed"):
            self.builds.labels(result)  # every series exists from the start, so rate() sees the first build

    def count_request(self, verb: str, resource: str, status: int) -> None:
        self.api_requests.labels(verb, resource, str(status)).inc()

    def observe_reconcile(self, result: str, seconds: float, reason: str | None = None) -> None:
        self.reconciles.labels(result).inc()
        self.reconcile_seconds.labels(result).observe(seconds)
        if reason:
            self.reconcile_errors.labels(reason).inc()

    def set_state(self, namespace: str, name: str, phase: str | None,
                  pools: dict[str, tuple[int, int | None]] | None = None) -> None:
        """Record a SpecServing's phase and pools (pool -> (ready, desired)); phase None forgets it."""
        key = (namespace, name)
        before = self._phases.pop(key, None) if phase is None else self._phases.get(key)
        if phase is not None:
            self._phases[key] = phase
        if before != phase:  # counted as it changes: every pass records its phase, and there may be thousands
            for changed, step in ((before, -1), (phase, 1)):
                if changed is not None:
                    self._phase_counts[changed] += step
                    self.specservings.labels(changed).set(self._phase_counts[changed])
        if phase is None or not pools:
            self._pools.pop(key, None)
        elif self._pools.get(key) != pools:
            self._pools[key] = dict(pools)  # replaced, never changed in place: a scrape reads it from another thread


class PoolGauges:
    """specserving_pool_replicas_ready and specserving_pool_replicas_desired, made from the pools Metrics.set_state
    recorded when Prometheus scrapes, as kube-state-metrics makes its series from its store. A labelled Gauge
    child per pool and SpecServing (six per SpecServing) cost about 4 MiB at N=1,000 (tracemalloc), kept whether
    or not anybody scraped."""

    LABELS = ("namespace", "specserving", "pool")

    def __init__(self, pools: Mapping[tuple[str, str], Mapping[str, tuple[int, int | None]]]) -> None:
        self.pools = pools

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        ready, desired = self._families()
        # One copy of the items: the event loop's thread adds and removes SpecServings while this reads them.
        for (namespace, name), pools in list(self.pools.items()):
            for pool, (ready_count, desired_count) in pools.items():
                ready.add_metric([namespace, name, pool], ready_count)
                if desired_count is not None:
                    desired.add_metric([namespace, name, pool], desired_count)
        yield ready
        yield desired

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("specserving_pool_replicas_ready", "Ready replicas of a pool.", labels=self.LABELS),
                GaugeMetricFamily("specserving_pool_replicas_desired", "Desired replicas of a pool (from spec).",
                                  labels=self.LABELS))
