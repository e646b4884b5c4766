"""`python -m bench`: start a local control plane, measure the operator against its baselines for each N, write the
results (docs/benchmarks.md, docs/benchmarks-latency.png, a JSON file) and print the table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import cluster as C
from bench import heap as H
from bench import measure as M
from bench import peer as P
from bench import report as R
from bench import workload as W
from bench.floor import FloorWebhook
from bench.operating import Operator
from bench.recorder import Recorder

SPARE_NODES = 2  # scale samples run one at a time on each side: one extra decode pod at a time


def nodes_for(n: int) -> int:
    return W.NODES_PER_SPS * n + SPARE_NODES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,100,1000", help="numbers of SpecServings, comma-separated (default %(default)s)")
    p.add_argument("--idle-seconds", default="30",
                   help="the idle window in which no write may happen: one number for every size, or one per size, "
                        "comma-separated (600 for the 10-minute check; default %(default)s)")
    p.add_argument("--resync-seconds", type=float, default=None,
                   help="the operator's --resync-seconds (default: a fifth of the size's idle window, at least 2)")
    p.add_argument("--children-repeats", type=int, default=4,
                   help="at one N (--children-repeats-at): further apply -> children samples per side, each a new "
                        "instance applied alone and deleted again (default %(default)s)")
    p.add_argument("--children-repeats-at", type=int, default=1,
                   help="the N that takes --children-repeats (default %(default)s)")
    p.add_argument("--scale-samples", type=int, default=7, help="kubectl scale samples per side and N (default %(default)s)")
    p.add_argument("--webhook-rates", default="20,100",
                   help="request rates (per second) for the webhook, comma-separated (default %(default)s); measured "
                        "once, with the operator of the first size, before its SpecServings are applied")
    p.add_argument("--webhook-seconds", type=float, default=30.0,
                   help="seconds at each rate for each of the three webhook series (default %(default)s: at 20/s a "
                        "p99 of 600 requests, not the 2nd slowest of 200)")
    p.add_argument("--webhook-quiet-seconds", type=float, default=300.0,
                   help="before each webhook rate, wait at most this long for the machine's CPUs to be less than "
                        "25%% busy over 2 s, so that a control plane still settling is not measured as the "
                        "webhook's latency (default %(default)s)")
    p.add_argument("--out-md", default="docs/benchmarks.md", help="the results page (default %(default)s)")
    p.add_argument("--out-png", default="docs/benchmarks-latency.png", help="the latency plot (default %(default)s)")
    p.add_argument("--out-json", default="out/bench/results.json", help="every figure as JSON (default %(default)s)")
    p.add_argument("--work-dir", default="out/bench", help="operator logs and applied files (default %(default)s)")
    p.add_argument("--kubeconfig", help="use this running cluster instead of starting one (it needs 2N+2 free fake "
                                        "8-GPU nodes); the bench then stops nothing")
    p.add_argument("--cluster-name", default=os.environ.get("SPECSERVING_BENCH_CLUSTER_NAME", "specserving-bench"),
                   help="the kwokctl cluster the bench starts (default %(default)s)")
    p.add_argument("--keep-cluster", action="store_true", help="leave the cluster the bench started running (it is "
                                                                "recreated for each N, with 2N+2 nodes)")
    p.add_argument("--timeout-per-sps", type=float, default=3.0,
                   help="seconds of waiting allowed per SpecServing on top of 120 s (default %(default)s)")
    p.add_argument("--profile", action="store_true",
                   help="sample the operator with py-spy during the apply and webhook phases (collapsed stacks and "
                        "a summary in the work dir and the JSON)")
    p.add_argument("--heap-profile", action="store_true",
                   help="run the operator under tracemalloc (from 10 s after its start) and record its heap by "
                        "allocating line once every SpecServing is Ready (heap-N.json in the work dir, and the "
                        "JSON); tracing slows it, so the timings of such a run do not count")
    p.add_argument("--webhook-mode", choices=("chart", "self", "none"), default="chart",
                   help="chart (default): the webhook on certificate files, with a configuration the bench applies, "
                        "as the Helm chart runs it; self: the operator makes its certificate and configuration, as "
                        "on local clusters (it then imports cryptography, 8.8 MiB more RSS); none: no webhook at "
                        "all, to measure what reviewing every SpecServing costs a burst (no webhook series)")
    p.add_argument("--operator-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `specserving run` (repeatable)")
    return p.parse_args(argv)


def run_size(cl: C.Cluster, n: int, s: M.Settings, extra: list[str], webhook: list[dict[str, Any]] | None,
             reused: bool = True) -> dict[str, Any]:
    """Measure one N; with `webhook` (a list), also measure the webhook at every rate and append the results.
    Unless the cluster is `reused` after this N, its namespaces are deleted without waiting: the cluster goes
    next, and waiting for the garbage collector to remove thousands of objects would only add minutes."""
    op_ns, base_ns = f"bench-op-{n}", f"bench-base-{n}"
    started = time.monotonic()
    for ns in (op_ns, base_ns):
        if cl.api.request("GET", f"/api/v1/namespaces/{ns}")[0] == 200:
            C.log(f"deleting namespace {ns} left by an earlier run")
            cl.delete_namespace(ns, s.timeout(n) * 2)
        cl.create_namespace(ns, {"specserving.io/bench": "true"})
    free = cl.gpu_nodes_ready()
    if free < W.NODES_PER_SPS * n + SPARE_NODES:
        raise RuntimeError(f"N={n} needs {W.NODES_PER_SPS * n + SPARE_NODES} fake 8-GPU nodes, the cluster has {free}")
    # One ClusterIP Service (the router's) per SpecServing on each side; the baseline's stay until the end.
    if cl.ensure_service_ips(2 * n + 10):
        C.log("added ServiceCIDR specserving-bench (10.8.0.0/16): the default range holds about 250 Services")
    base_rec, op_rec = Recorder(cl.api, base_ns), Recorder(cl.api, op_ns)
    base_rec.start()
    op_rec.start()
    result: dict[str, Any] = {"n": n}
    op: Operator | None = None
    configuration = f"specserving-bench-{n}" if s.webhook_mode != "none" else None
    try:
        groups = [W.render(W.specserving(i, base_ns)) for i in range(n)]
        refs = {i: W.refs(g) for i, g in enumerate(groups)}
        result["baseline"] = M.baseline(cl, n, base_ns, base_rec, s, groups)
        M.free_nodes(cl, base_ns, s, n)
        env = {**cl.env, **H.env_for(s.out_dir)} if s.heap_profile else cl.env
        op = Operator(cl.kubeconfig, op_ns, s.out_dir / f"operator-{n}.log", resync_seconds=s.resync(),
                      webhook_configuration=configuration, env=env, extra=extra, webhook_mode=s.webhook_mode)
        rss_start, _ = op.memory()
        if configuration is not None:
            wait_webhook(cl, op_ns, s)
            if webhook is not None:
                webhook += measure_webhook(cl, op, n, op_ns, base_ns, s)
        result["operator"] = M.operator_phase(cl, n, op_ns, op_rec, op, s, refs)
        result["operator"]["rss_start_mib"] = rss_start
        result["operator"]["log_errors"] = log_errors(op.tail(10**9))
        op.stop()  # the peer runs alone
        op = None
        result["peer"] = measure_peer(cl, n, s)
    finally:
        if op is not None:
            op.stop()
        if configuration is not None:
            cl.kubectl("delete", "validatingwebhookconfiguration", configuration, "--ignore-not-found", check=False)
        for rec in (base_rec, op_rec):
            rec.stop()
        errors = base_rec.errors() + op_rec.errors()
        if errors:
            C.log(f"watch hiccups (retried): {errors}")
        for ns in (op_ns, base_ns):
            if reused:
                cl.delete_namespace(ns, s.timeout(n) * 3)
            else:
                cl.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
    result["seconds"] = time.monotonic() - started
    return result


def measure_webhook(cl: C.Cluster, op: Operator, n: int, op_ns: str, base_ns: str,
                    s: M.Settings) -> list[dict[str, Any]]:
    """The webhook series at every rate, beside the no-op Go webhook (bench/floor.py) in a namespace of its own."""
    floor_ns = f"bench-floor-{n}"
    cl.create_namespace(floor_ns, {"specserving.io/bench": "true"})
    try:
        floor = FloorWebhook(cl.kubeconfig, floor_ns, s.out_dir)
        try:
            wait_webhook(cl, floor_ns, s)
            return [M.webhook(cl, op, op_ns, base_ns, floor_ns, s, rate) for rate in s.webhook_rates]
        finally:
            floor.stop()
    finally:
        cl.kubectl("delete", "namespace", floor_ns, "--wait=false", "--ignore-not-found", check=False)


def measure_peer(cl: C.Cluster, n: int, s: M.Settings) -> dict[str, Any]:
    """The LeaderWorkerSet controller at the same N (bench/peer.py); a failure is reported, not fatal to this N."""
    if cl.name is None:
        return {"skipped": "the LeaderWorkerSet peer runs only on a cluster the bench starts (not --kubeconfig)"}
    try:
        return P.lws_phase(cl, n, s.out_dir, s.timeout(n))
    except Exception as exc:  # noqa: BLE001 - the operator's figures of this N stand without it
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


def log_errors(text: str) -> int:
    """Tracebacks and ERROR lines in the operator's log, but for kopf's line about the refusal wait_webhook asks for."""
    return sum(1 for line in text.splitlines() if "Traceback" in line or (
        "ERROR" in line and "Webhook 'validate-specserving' failed permanently" not in line))


def wait_webhook(cl: C.Cluster, ns: str, s: M.Settings) -> None:
    """The API server calls the webhook: an object only the webhook refuses is refused."""
    bad = W.specserving("bench-webhook-check", ns)
    bad["spec"]["speculative"]["algorithm"] = "NGRAM"

    def refused() -> bool:
        status, body = cl.api.request("POST", f"{M.GROUP_PATH}/namespaces/{ns}/specservings", bad,
                                      query={"dryRun": "All"})
        return status >= 400 and "admission webhook" in str(body)

    M.wait_until("the webhook answering the API server", refused, 60, interval=0.5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
        idles = [float(x) for x in args.idle_seconds.split(",") if x.strip()]
    except ValueError as exc:
        print(f"python -m bench: --sizes and --idle-seconds take comma-separated numbers ({exc})", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1:
        print("python -m bench: --sizes needs positive integers", file=sys.stderr)
        return 2
    if len(idles) == 1:
        idles *= len(sizes)
    if len(idles) != len(sizes) or min(idles) <= 0:
        print(f"python -m bench: --idle-seconds needs one positive number, or one for each of the {len(sizes)} sizes",
              file=sys.stderr)
        return 2
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    s = M.Settings(idle_seconds=idles[0], resync_seconds=args.resync_seconds,
                   scale_samples=args.scale_samples, children_repeats=args.children_repeats,
                   children_repeats_at=args.children_repeats_at,
                   webhook_rates=tuple(float(x) for x in args.webhook_rates.split(",") if x.strip()),
                   webhook_seconds=args.webhook_seconds, quiet_limit_s=args.webhook_quiet_seconds, out_dir=work,
                   timeout_per_sps=args.timeout_per_sps,
                   profile=args.profile, heap_profile=args.heap_profile, webhook_mode=args.webhook_mode)
    info = C.machine()
    t0 = time.monotonic()
    results: dict[str, Any] = {"machine": info, "settings": {
        "sizes": sizes, "idle_seconds": idles,
        "resync_seconds": [dataclasses.replace(s, idle_seconds=x).resync() for x in idles],
        "scale_samples": s.scale_samples, "children_repeats": s.children_repeats,
        "children_repeats_at": s.children_repeats_at, "webhook_rates": list(s.webhook_rates),
        "webhook_seconds": s.webhook_seconds,
        "webhook_quiet": {"busy_below": s.quiet_busy, "window_s": s.quiet_window_s, "limit_s": s.quiet_limit_s},
        "nodes": "external cluster" if args.kubeconfig else ", ".join(str(nodes_for(n)) for n in sizes),
        "webhook_mode": s.webhook_mode},
        "sizes": [], "webhook": {"n": sizes[0], "rates": []}, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    rc = 0
    cl: C.Cluster | None = None
    try:
        for k, n in enumerate(sizes):
            C.log(f"--- N={n} ---")
            try:
                # Each N gets a cluster with the nodes it needs (hack/cluster.sh up recreates the cluster when the
                # node count changes), so small N do not pay for thousands of idle fake nodes.
                if cl is None or not args.kubeconfig:
                    cl = C.attach(args.kubeconfig) if args.kubeconfig else C.start(args.cluster_name, nodes_for(n))
                    info["kubernetes"] = cl.version()
                    cl.install_crd()
                    if k == 0:
                        W.check_cli_render("bench-render-check", work, cl.env)
                # The next N reuses this cluster when it is external or needs as many nodes; otherwise it goes.
                reused = bool(args.kubeconfig) or (k + 1 < len(sizes) and nodes_for(sizes[k + 1]) == nodes_for(n))
                result = run_size(cl, n, dataclasses.replace(s, idle_seconds=idles[k]), args.operator_arg,
                                  results["webhook"]["rates"] if k == 0 else None, reused=reused)
                result["nodes"] = cl.gpu_nodes_ready()
                results["sizes"].append(result)
                if "error" in result.get("peer", {}):
                    rc = 1
            except Exception as exc:  # noqa: BLE001 - report what was measured, and why the rest was not
                traceback.print_exc()
                results["sizes"].append({"n": n, "error": f"{type(exc).__name__}: {exc}"})
                rc = 1
    finally:
        results["seconds"] = time.monotonic() - t0
        info["loadavg_end"] = os.getloadavg()[0]
        if cl is not None and not args.keep_cluster:
            C.stop(cl)
    out_json = Path(args.out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=2, default=str))
    table = R.write(results, Path(args.out_md), Path(args.out_png))
    print(table)
    C.log(f"wrote {args.out_md}, {args.out_png} and {out_json} in {results['seconds']:.0f} s")
    return rc
