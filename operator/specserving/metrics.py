"""The operator's Prometheus metrics (prometheus-client), served by `specserving run --metrics-port`.

Names follow Prometheus conventions: the specserving_ prefix, _total for counters, _seconds for durations.
`Metrics` owns its collectors on a registry of its choice, so tests can make as many as they like.
"""

from __future__ import annotations

import collections

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

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
        self.pool_ready = Gauge("specserving_pool_replicas_ready", "Ready replicas of a pool.",
                                ["namespace", "specserving", "pool"], registry=r)
        self.pool_desired = Gauge("specserving_pool_replicas_desired", "Desired replicas of a pool (from spec).",
                                  ["namespace", "specserving", "pool"], registry=r)
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
        # What the pool gauges hold per SpecServing: a pass that changes none of them touches no gauge.
        self._pools: dict[tuple[str, str], dict[str, tuple[int, int | None]]] = {}
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
        if phase is not None and pools and self._pools.get(key) == pools:
            return
        for pool in set(self._pools.pop(key, {})) - set(pools or {}):
            for gauge in (self.pool_ready, self.pool_desired):
                try:
                    gauge.remove(namespace, name, pool)
                except KeyError:
                    pass
        if phase is None or not pools:
            return
        for pool, (ready, desired) in pools.items():
            self.pool_ready.labels(namespace, name, pool).set(ready)
            if desired is not None:
                self.pool_desired.labels(namespace, name, pool).set(desired)
        self._pools[key] = dict(pools)
