"""One size N of the bench: the baseline (server-side apply of the rendered children, Deployment scaling), then
the operator (kubectl apply of N SpecServings, kubectl scale), the webhook at a fixed rate, and an idle window.

Timing rule, the same on both sides: all N objects go in one `kubectl apply --server-side -f FILE`, whose first
document is a marker ConfigMap: kubectl prints a line per object as it applies it, and the marker's line is the
moment kubectl (started, discovery done) sends its first real request. "apply -> children created" of object i
runs from that moment to the arrival, at the bench's own watches, of the last of SpecServing i's children;
"apply -> Ready" to SpecServing i's Ready condition (for the baseline: its three Deployments available at once).
The max over i is the time until all N are done.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

from bench import heap
from bench import workload as W
from bench.cluster import Cluster, log
from bench.kubeapi import Api
from bench.operating import WRITE_VERBS, Operator
from harness.prometheus import by_label, delta, select, total
from bench.profiling import Profile
from bench.recorder import INSTANCE, Recorder
from bench.stats import histogram_quantile, percentile, summary

GROUP_PATH = "/apis/specserving.io/v1alpha1"
WEBHOOK_NAME = "validate.specservings.specserving.io"
FLOOR_WEBHOOK_NAME = "noop.specservings.bench.specserving.io"  # bench/floor.py's: the histogram tells them apart
CHILD_RESOURCES = "deployments|services|serviceaccounts|roles|rolebindings|poddisruptionbudgets"


@dataclass
class Settings:
    idle_seconds: float = 30.0
    resync_seconds: float | None = None  # default: idle / 5, at least 2
    # Seven, not three: the median of three is one draw of the middle (issue 21: N=100 gave 1.55x on three samples
    # and 1.30x on seven, with the same code on the same day).
    scale_samples: int = 7
    # At one N (children_repeats_at): more apply -> children created samples, each a new instance applied on its own
    # and deleted again, so that that N's p50 is not one draw (issue 21: N=1's figure moved 1.05x-1.22x between
    # runs of the same code).
    children_repeats: int = 4
    children_repeats_at: int = 1  # the N that takes them (the smoke test's N, to run them there)
    webhook_rates: tuple[float, ...] = (20.0, 100.0)
    webhook_seconds: float = 30.0
    out_dir: Path = Path("out/bench")
    timeout_base: float = 120.0
    timeout_per_sps: float = 3.0
    profile: bool = False  # py-spy the operator during the apply and webhook phases
    heap_profile: bool = False  # tracemalloc in the operator; its heap by line once every SpecServing is Ready
    webhook_mode: str = "chart"  # bench/operating.py: certificate files as the chart gives them, "self" or "none"
    # Before each webhook series: wait (at most quiet_limit_s) until the machine's CPUs are busy less than
    # quiet_busy of a quiet_window_s window, so that the series measures the webhook, not a control plane that is
    # still settling (issue 21: "with the API server not saturated").
    quiet_busy: float = 0.25
    quiet_window_s: float = 2.0
    quiet_limit_s: float = 300.0

    def resync(self) -> float:
        return self.resync_seconds if self.resync_seconds is not None else max(2.0, self.idle_seconds / 5)

    def timeout(self, n: int) -> float:
        return self.timeout_base + self.timeout_per_sps * n


def apply_stream(cluster: Cluster, docs: list[dict[str, Any]], path: Path) -> list[float]:
    """kubectl apply --server-side -f FILE; the arrival time of each object's output line, in document order."""
    path.write_text(yaml.safe_dump_all(docs))
    errors = path.with_suffix(".stderr")
    with errors.open("w") as stderr:  # a file, not a pipe: kubectl must never block on what it says there
        proc = cluster.kubectl_popen("apply", "--server-side", "--force-conflicts", "-f", str(path), stderr=stderr)
        assert proc.stdout is not None
        times = [time.monotonic() for _ in proc.stdout]
        rc = proc.wait()
    err = errors.read_text()
    if rc != 0 or len(times) != len(docs):
        raise RuntimeError(f"kubectl apply of {path} exited {rc} after {len(times)} of {len(docs)} objects: "
                           f"{err.strip()[-2000:]}")
    return times


def wait_until(what: str, predicate: Any, timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def _all(fn: Any, n: int) -> dict[int, float] | None:
    """{i: fn(i)} for every i < n once none is None; else None."""
    found = {}
    for i in range(n):
        t = fn(i)
        if t is None:
            return None
        found[i] = t
    return found


def _latencies(done: dict[int, float], t0: float) -> list[float]:
    """From the start of the one kubectl command that applied all N (its marker line) to each object's time."""
    return [done[i] - t0 for i in sorted(done)]


def _since(done: dict[int, float], starts: dict[int, float]) -> list[float]:
    """From the moment kubectl started on each object's own request (JSON only: on the baseline side kubectl's own
    queue is left out, on the operator's side the operator's queue is in, so the two do not compare)."""
    return [done[i] - starts[i] for i in sorted(done)]


def _samples(times: list[float], starts: dict[int, float], created: dict[int, float],
             ready: dict[int, float]) -> dict[str, list[float]]:
    """Raw per-object figures (seconds from kubectl's marker line), for the JSON file."""
    t0 = times[0]
    return {"start": [round(starts[i] - t0, 4) for i in sorted(starts)],
            "children": [round(created[i] - t0, 4) for i in sorted(created)],
            "ready": [round(ready[i] - t0, 4) for i in sorted(ready)],
            "lines": [round(t - t0, 4) for t in times]}


def _apiserver_requests(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Requests to the API server between two scrapes, as 'VERB resource[/subresource]' -> count (all clients)."""
    out: dict[str, float] = {}
    for labels, value in select(delta(after, before), "apiserver_request_total").items():
        d = dict(labels)
        if d.get("dry_run"):
            continue
        key = f"{d.get('verb')} {d.get('resource')}" + (f"/{d['subresource']}" if d.get("subresource") else "")
        out[key] = out.get(key, 0.0) + value
    return dict(sorted(out.items()))


def _writes(requests: dict[str, float]) -> float:
    return sum(v for k, v in requests.items() if k.split()[0] in WRITE_VERBS)


# -- the baseline ----------------------------------------------------------------------------------------------


def baseline(cluster: Cluster, n: int, ns: str, rec: Recorder, s: Settings,
             groups: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """`groups`: the rendered children of each SpecServing, in namespace `ns`."""
    k = len(groups[0])
    docs = [W.marker(ns, f"baseline-{n}")] + [c for g in groups for c in g]
    log(f"N={n} baseline: kubectl apply --server-side of {n * k} rendered children in {ns}")
    a0 = cluster.apiserver_metrics()
    times = apply_stream(cluster, docs, s.out_dir / f"baseline-{n}.yaml")
    starts = {i: times[i * k] for i in range(n)}
    refs = {i: W.refs(g) for i, g in enumerate(groups)}
    created = wait_until("the baseline's children", lambda: _all(lambda i: rec.all_seen(refs[i]), n), s.timeout(n))
    ready = wait_until("the baseline's Deployments available",
                       lambda: _all(lambda i: rec.available_at(W.name(i)), n), s.timeout(n) * 2)
    a1 = cluster.apiserver_metrics()
    out = {
        "children": summary(_latencies(created, times[0])),
        "ready": summary(_latencies(ready, times[0])),
        "children_since_own_apply": summary(_since(created, starts)),
        "ready_since_own_apply": summary(_since(ready, starts)),
        "children_per_specserving": k,
        "samples": _samples(times, starts, created, ready),
        "apiserver_requests": _apiserver_requests(a1, a0),
    }
    decode = {i: next(c["metadata"]["name"] for c in g if c["kind"] == "Deployment"
                      and c["metadata"]["labels"].get("specserving.io/role") == "decode")
              for i, g in enumerate(groups)}
    out["scale"] = _scale(cluster, n, ns, rec, s, lambda i, r: ("deployment", decode[i], r), operator=None)
    _children_again(cluster, n, ns, rec, s, "baseline", out, operator=None, apply_children=True)
    log(f"N={n} baseline: children p50 {out['children']['p50']:.3f} s, Ready p50 {out['ready']['p50']:.3f} s")
    return out


def _children_again(cluster: Cluster, n: int, ns: str, rec: Recorder, s: Settings, side: str, out: dict[str, Any],
                    operator: Operator | None, apply_children: bool) -> None:
    """Further apply -> children created samples at N = s.children_repeats_at (none at other N): a new instance each
    time, applied alone by the same kubectl command as the first (the rendered children on the raw SSA side, the
    SpecServing on the operator's) and timed the same way, then deleted, its Deployments, ReplicaSets and pods gone
    before the next. `out["children"]` becomes the summary of them all; `out["children_samples"]` holds each, first
    first."""
    if n != s.children_repeats_at or not s.children_repeats:
        return
    samples = list(out["samples"]["children"])
    for r in range(s.children_repeats):
        inst = f"{W.PREFIX}-again-{r}"
        obj = W.specserving(inst, ns)
        children = W.render(obj)
        refs = W.refs(children)
        settle(operator)
        docs = [W.marker(ns, f"{side}-again-{r}"), *(children if apply_children else [obj])]
        times = apply_stream(cluster, docs, s.out_dir / f"{side}-{n}-again-{r}.yaml")
        done = wait_until(f"{inst}'s children", lambda: rec.all_seen(refs), s.timeout(1))
        samples.append(done - times[0])
        gone = [f"{kind.lower()}/{name}" for kind, name in refs] if apply_children else [f"specserving/{inst}"]
        cluster.kubectl("delete", "-n", ns, "--wait=false", *gone)
        wait_until(f"{inst}'s workloads to be deleted", lambda: not _left(cluster, ns, inst), s.timeout(1),
                   interval=0.5)
    out["children"] = summary(samples)
    out["children_samples"] = [round(x, 4) for x in samples]


def _left(cluster: Cluster, ns: str, inst: str) -> list[str]:
    """What is left of an instance's Deployments, ReplicaSets and pods (a ReplicaSet may still make a pod)."""
    paths = (f"/apis/apps/v1/namespaces/{ns}/deployments", f"/apis/apps/v1/namespaces/{ns}/replicasets",
             f"/api/v1/namespaces/{ns}/pods")
    return [p for p in paths if cluster.api.get(p, labelSelector=f"{INSTANCE}={inst}", limit="1")["items"]]


def free_nodes(cluster: Cluster, ns: str, s: Settings, n: int) -> None:
    """Delete the baseline's Deployments and wait for their pods to go, so the operator finds the nodes free."""
    cluster.kubectl("delete", "deployments", "--all", "-n", ns, "--wait=false")
    wait_until(f"the pods in {ns} to be deleted",
               lambda: not cluster.api.get(f"/api/v1/namespaces/{ns}/pods", limit="1")["items"],
               s.timeout(n), interval=1)


# -- scaling --------------------------------------------------------------------------------------------------


def _scale(cluster: Cluster, n: int, ns: str, rec: Recorder, s: Settings, target: Any,
           operator: Operator | None) -> dict[str, Any]:
    """kubectl scale 1 -> 2 decode replicas on a few instances, one at a time: until the new pod runs Ready. With
    fewer instances than samples, an instance is scaled again once it is back to 1, so N=1 gets every sample too."""
    samples: list[float] = []
    created: list[float] = []
    count = s.scale_samples
    for j in range(count):
        i = j * n // count
        inst = W.name(i)
        kind, obj_name, _ = target(i, 2)
        settle(operator)
        started = time.monotonic()
        cluster.kubectl("scale", "-n", ns, f"{kind}/{obj_name}", "--replicas=2")
        done = wait_until(f"{inst}: 2 decode pods Running", lambda: rec.decode_reached(inst, 2, started),
                          s.timeout(1))
        samples.append(done - started)
        pod = rec.decode_pods_reached(inst, 2, started)
        if pod is not None:
            created.append(pod - started)
        cluster.kubectl("scale", "-n", ns, f"{kind}/{obj_name}", "--replicas=1")
        wait_until(f"{inst}: back to 1 decode pod", lambda: rec.decode_settled(inst, 1), s.timeout(1))
        if operator is not None:
            wait_until(f"{inst}: Ready again", lambda: rec.sps_is_ready(inst), s.timeout(1))
    return {**summary(samples), "samples": samples, "pod_created": summary(created)}


def settle(operator: Operator | None, quiet: float = 1.0, timeout: float = 60.0) -> None:
    """Let the previous step finish: one quiet second (for the operator: no reconcile pass for a second, so a scale
    sample does not queue behind passes for the pods that the step before made)."""
    if operator is None:
        time.sleep(quiet)
        return
    deadline = time.monotonic() + timeout
    last = total(operator.metrics("specserving_reconcile_total"), "specserving_reconcile_total")
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = total(operator.metrics("specserving_reconcile_total"), "specserving_reconcile_total")
        if now == last:
            return
        last = now


# -- the operator -----------------------------------------------------------------------------------------------


class QueueDepth:
    """The operator's queues, sampled from its /metrics every `interval` seconds in a thread until stopped: the
    SpecServings waiting for a pass, and the API calls waiting in each lane of reconcile/calls.py."""

    LANES = ("spec", "follow_up", "resync", "background")

    def __init__(self, op: Operator, interval: float = 1.0) -> None:
        self.op, self.interval = op, interval
        self.t0 = time.monotonic()
        self.series: dict[str, list[float]] = {"t": [], "passes_queued": [], **{lane: [] for lane in self.LANES}}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-depth", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                samples = self.op.metrics("specserving_passes_queued", "specserving_api_calls_waiting")
            except Exception:  # noqa: BLE001 - a missed sample is a gap in the series, not a failed bench
                continue
            self.series["t"].append(round(time.monotonic() - self.t0, 2))
            self.series["passes_queued"].append(total(samples, "specserving_passes_queued"))
            waiting = by_label(samples, "specserving_api_calls_waiting", "urgency")
            for lane in self.LANES:
                self.series[lane].append(waiting.get(lane, 0.0))

    def stop(self, since: float) -> dict[str, Any]:
        """The series, with times from `since` (kubectl's marker line), and each one's peak."""
        self._stop.set()
        self._thread.join()
        shift = since - self.t0
        out: dict[str, Any] = {**self.series, "t": [round(t - shift, 2) for t in self.series["t"]]}
        out["peak"] = {k: max(v, default=0.0) for k, v in self.series.items() if k != "t"}
        return out


WEBHOOK_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"  # the API server's, per call


def _webhook_calls(theirs: dict[str, float], name: str = WEBHOOK_NAME) -> dict[str, Any]:
    """The API server's calls to a webhook (ours by default) in a window (its own histogram): how many, and how
    long."""
    calls = sum(select(theirs, f"{WEBHOOK_HISTOGRAM}_count", name=name).values())
    seconds = sum(select(theirs, f"{WEBHOOK_HISTOGRAM}_sum", name=name).values())
    return {"calls": calls, "mean_ms": seconds / calls * 1000 if calls else None,
            "p50_ms": _ms(histogram_quantile(theirs, WEBHOOK_HISTOGRAM, 0.5, name=name)),
            "p99_ms": _ms(histogram_quantile(theirs, WEBHOOK_HISTOGRAM, 0.99, name=name))}


def operator_phase(cluster: Cluster, n: int, ns: str, rec: Recorder, op: Operator, s: Settings,
                   children: dict[int, list[tuple[str, str]]]) -> dict[str, Any]:
    """`children`: the (kind, name) of each SpecServing's children, as the renderer names them."""
    objs = [W.specserving(i, ns) for i in range(n)]
    docs = [W.marker(ns, f"operator-{n}"), *objs]
    m0, a0, cpu0 = op.metrics(), cluster.apiserver_metrics(), op.cpu_seconds()
    log(f"N={n} operator: kubectl apply --server-side of {n} SpecServings in {ns}")
    prof = Profile(op.pid, s.out_dir / f"profile-apply-{n}.txt") if s.profile else None
    depth = QueueDepth(op)
    times = apply_stream(cluster, docs, s.out_dir / f"operator-{n}.yaml")
    starts = {i: times[i] for i in range(n)}
    created = wait_until("the operator's children", lambda: _all(lambda i: rec.all_seen(children[i]), n),
                         s.timeout(n))
    ready = wait_until("the SpecServings Ready", lambda: _all(lambda i: rec.ready_at(W.name(i)), n),
                       s.timeout(n) * 2)
    m1, a1, cpu1 = op.metrics(), cluster.apiserver_metrics(), op.cpu_seconds()
    queues = depth.stop(since=times[0])
    heap_sites = heap.snapshot(op.pid, s.out_dir, n) if s.heap_profile else None
    profile = prof.stop() if prof else None
    rss_now, rss_peak = op.memory()
    mine = delta(m1, m0)
    verbs = by_label(mine, "specserving_api_requests_total", "verb")
    apiserver = _apiserver_requests(a1, a0)
    kopf_patches = apiserver.get("PATCH specservings", 0.0)  # kopf's annotations; nobody else patches them
    operator_writes = sum(v for verb, v in verbs.items() if verb in WRITE_VERBS)
    out: dict[str, Any] = {
        "children": summary(_latencies(created, times[0])),
        "ready": summary(_latencies(ready, times[0])),
        "children_since_own_apply": summary(_since(created, starts)),
        "ready_since_own_apply": summary(_since(ready, starts)),
        "samples": _samples(times, starts, created, ready),
        "cpu_seconds": cpu1 - cpu0,
        "rss_mib": rss_now, "peak_rss_mib": rss_peak,
        "requests_by_verb": dict(sorted(verbs.items())),
        "status_writes": total(mine, "specserving_status_writes_total"),
        "kopf_annotation_patches": kopf_patches,
        "writes_per_specserving": operator_writes / n,
        "writes_per_specserving_with_kopf": (operator_writes + kopf_patches) / n,
        "child_applies_apiserver": sum(v for k, v in apiserver.items()
                                       if k.startswith("APPLY ") and k.split()[1].split("/")[0] in
                                       CHILD_RESOURCES.split("|")),
        "apiserver_requests": apiserver,
        "reconciles": total(mine, "specserving_reconcile_total"),
        "queue_depth": queues,
        "webhook_during_apply": _webhook_calls(delta(a1, a0)),
    }
    if heap_sites is not None:
        out["heap"] = heap_sites
    if profile:
        out["profile"] = profile
    log(f"N={n} operator: children p50 {out['children']['p50']:.3f} s, Ready p50 {out['ready']['p50']:.3f} s, "
        f"{out['cpu_seconds']:.1f} CPU s, peak RSS {rss_peak:.0f} MiB")
    cpu_s = op.cpu_seconds()
    out["scale"] = _scale(cluster, n, ns, rec, s, lambda i, r: ("specserving", W.name(i), r), operator=op)
    out["scale_cpu_seconds"] = op.cpu_seconds() - cpu_s
    out["idle"] = idle(cluster, n, rec, op, s)
    _children_again(cluster, n, ns, rec, s, "operator", out, operator=op, apply_children=False)
    _, out["peak_rss_mib"] = op.memory()
    return out


def idle(cluster: Cluster, n: int, rec: Recorder, op: Operator, s: Settings) -> dict[str, Any]:
    """Nothing changes for `idle_seconds` while the operator resyncs every SpecServing every few seconds."""
    wait_until("every SpecServing Ready before the idle window",
               lambda: all(rec.sps_is_ready(W.name(i)) for i in range(n)), s.timeout(n))
    time.sleep(min(5.0, s.resync()))  # the last scale-down's pod deletions and events settle
    log(f"N={n} idle window: {s.idle_seconds:g} s, resync every {s.resync():g} s")
    m0, a0, cpu0 = op.metrics(), cluster.apiserver_metrics(), op.cpu_seconds()
    time.sleep(s.idle_seconds)
    m1, a1, cpu1 = op.metrics(), cluster.apiserver_metrics(), op.cpu_seconds()
    mine = delta(m1, m0)
    verbs = by_label(mine, "specserving_api_requests_total", "verb")
    apiserver = _apiserver_requests(a1, a0)
    ours = {k: v for k, v in apiserver.items() if k.startswith("APPLY ") or " specservings" in k}
    return {
        "seconds": s.idle_seconds, "resync_seconds": s.resync(),
        "passes": total(mine, "specserving_reconcile_total"),
        "operator_requests": sum(verbs.values()),
        "operator_writes": sum(v for verb, v in verbs.items() if verb in WRITE_VERBS),
        "status_writes": total(mine, "specserving_status_writes_total"),
        "apiserver_applies_and_specserving_writes": _writes(ours),
        "apiserver_detail": ours,
        "cpu_seconds": cpu1 - cpu0,
    }


# -- the webhook --------------------------------------------------------------------------------------------------


def _review(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "specserving.io", "version": "v1alpha1", "kind": "SpecServing"},
        "resource": {"group": "specserving.io", "version": "v1alpha1", "resource": "specservings"},
        "requestKind": {"group": "specserving.io", "version": "v1alpha1", "kind": "SpecServing"},
        "requestResource": {"group": "specserving.io", "version": "v1alpha1", "resource": "specservings"},
        "name": obj["metadata"]["name"], "namespace": ns, "operation": "CREATE",
        "userInfo": {"username": "specserving-bench"}, "object": obj, "oldObject": None, "dryRun": True,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def cpu_busy(window: float) -> float:
    """The fraction of all CPUs' time spent busy over the next `window` seconds."""
    busy0, total0 = _cpu_times()
    time.sleep(window)
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0


def wait_quiet(s: Settings) -> tuple[float, float]:
    """Wait until the CPUs are busy less than s.quiet_busy over one window, or s.quiet_limit_s has passed.
    Returns (seconds waited, the last window's busy fraction); a caller reports a series that found no quiet."""
    started = time.monotonic()
    while True:
        busy = cpu_busy(s.quiet_window_s)
        if busy < s.quiet_busy or time.monotonic() - started >= s.quiet_limit_s:
            return time.monotonic() - started, busy


def webhook(cluster: Cluster, op: Operator, hooked_ns: str, plain_ns: str, floor_ns: str, s: Settings,
            rate: float) -> dict[str, Any]:
    """Dry-run creates at a fixed rate through the API server, in a namespace the webhook covers, in one it does
    not and in one a no-op Go webhook covers (bench/floor.py), in alternating one-second blocks; and the same rate
    of AdmissionReviews straight to the webhook."""
    api = Api(cluster.kubeconfig, maxsize=64)
    direct = urllib3.PoolManager(maxsize=64, cert_reqs="CERT_NONE", retries=False,
                                 timeout=urllib3.Timeout(connect=5, read=30))
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    probe = "bench-webhook-probe"
    bodies = {ns: json.dumps(W.specserving(probe, ns)).encode() for ns in (hooked_ns, plain_ns, floor_ns)}

    def through_apiserver(ns: str) -> tuple[float, int]:
        t = time.perf_counter()
        status, _ = api.request("POST", f"{GROUP_PATH}/namespaces/{ns}/specservings", data=bodies[ns],
                                query={"dryRun": "All"})
        return time.perf_counter() - t, status

    review_obj = W.specserving(probe, hooked_ns)

    def straight(_: str) -> tuple[float, int]:
        body = json.dumps(_review(review_obj, hooked_ns)).encode()
        t = time.perf_counter()
        r = direct.request("POST", f"{op.webhook_url}/validate-specserving", body=body,
                           headers={"Content-Type": "application/json"})
        ok = r.status == 200 and json.loads(r.data)["response"]["allowed"]
        return time.perf_counter() - t, 200 if ok else r.status

    series = {"webhook": (through_apiserver, hooked_ns), "no_webhook": (through_apiserver, plain_ns),
              "noop_webhook": (through_apiserver, floor_ns), "webhook_direct": (straight, hooked_ns)}
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in series}
    waited, busy = wait_quiet(s)
    log(f"webhook at {rate:g}/s: CPUs {busy:.0%} busy after {waited:.0f} s of waiting for them to settle")
    with ThreadPoolExecutor(max_workers=32) as pool:
        for fn, ns in series.values():  # warm up connections (ours, and the API server's to the webhook)
            list(pool.map(fn, [ns] * 20))
        m0, a0 = op.metrics(), cluster.apiserver_metrics()
        prof = Profile(op.pid, s.out_dir / f"profile-webhook-{rate:g}.txt") if s.profile else None
        blocks = max(1, round(s.webhook_seconds))
        per_block = max(1, round(rate * s.webhook_seconds / blocks))
        elapsed: dict[str, float] = {k: 0.0 for k in series}
        for b in range(blocks):
            order = list(series) if b % 2 == 0 else list(reversed(series))
            for key in order:
                fn, ns = series[key]
                futures = []
                start = time.monotonic()
                for j in range(per_block):
                    delay = start + j / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    futures.append(pool.submit(fn, ns))
                results[key] += [f.result() for f in futures]
                elapsed[key] += time.monotonic() - start
        m1, a1 = op.metrics(), cluster.apiserver_metrics()
    out: dict[str, Any] = {"rate": rate, "seconds_each": blocks * per_block / rate, "quiet_wait_s": waited,
                           "cpu_busy_before": busy}
    if prof:
        out["profile"] = prof.stop()
    for key, samples in results.items():
        ms = [x * 1000 for x, _ in samples]
        bad = sum(1 for _, code in samples if code not in (200, 201))
        out[key] = {"n": len(ms), "errors": bad, "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                    "max_ms": max(ms), "achieved_rate": len(ms) / elapsed[key] if elapsed[key] else None}
    mine, theirs = delta(m1, m0), delta(a1, a0)
    out["handler_p50_ms"] = _ms(histogram_quantile(mine, "specserving_webhook_review_duration_seconds", 0.5))
    out["handler_p99_ms"] = _ms(histogram_quantile(mine, "specserving_webhook_review_duration_seconds", 0.99))
    by_call = _webhook_calls(theirs)
    out["apiserver_call_p50_ms"], out["apiserver_call_p99_ms"] = by_call["p50_ms"], by_call["p99_ms"]
    buckets = select(theirs, f"{WEBHOOK_HISTOGRAM}_bucket", name=WEBHOOK_NAME)
    le = {dict(k)["le"]: 0.0 for k in buckets}
    for k, v in buckets.items():
        le[dict(k)["le"]] += v
    out["apiserver_call_buckets"] = dict(sorted(le.items(), key=lambda kv: float(kv[0].replace("+Inf", "inf"))))
    floor = _webhook_calls(theirs, FLOOR_WEBHOOK_NAME)
    out["noop_apiserver_call_p50_ms"], out["noop_apiserver_call_p99_ms"] = floor["p50_ms"], floor["p99_ms"]
    for q in ("p50", "p99"):
        out[f"added_{q}_ms"] = out["webhook"][f"{q}_ms"] - out["no_webhook"][f"{q}_ms"]
        # What calling any webhook costs this API server, and what ours adds beyond that.
        out[f"noop_added_{q}_ms"] = out["noop_webhook"][f"{q}_ms"] - out["no_webhook"][f"{q}_ms"]
        out[f"beyond_noop_{q}_ms"] = out["webhook"][f"{q}_ms"] - out["noop_webhook"][f"{q}_ms"]
    log(f"webhook at {rate:g}/s: p99 {out['webhook']['p99_ms']:.1f} ms with, "
        f"{out['no_webhook']['p99_ms']:.1f} ms without, {out['noop_webhook']['p99_ms']:.1f} ms with the no-op "
        f"webhook, direct {out['webhook_direct']['p99_ms']:.1f} ms")
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000
