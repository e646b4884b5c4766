"""The results page (Markdown tables of every figure and ratio, the targets met or missed) and the latency plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.stats import ratio

KEEP = "<!-- hand-written notes below this line; `make bench` keeps them when it rewrites the page -->"

TARGETS = {
    "children": 1.2,  # apply -> children created, operator / raw server-side apply
    "scale": 1.5,  # kubectl scale sps -> new decode pod Running, operator / Deployment scaled directly
    "rss_mib": 200.0,  # peak RSS with 1,000 SpecServings
    "webhook_p99_ms": 5.0,  # added by the webhook at 100 requests/s (issue 21; was 10 ms)
}


def _f(x: Any, unit: str = "", digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}{unit}"
    return f"{x}{unit}"


def _per_size(x: float | list[float]) -> str:
    """One figure, or one per size (results written before per-size idle windows hold a single number)."""
    return ", ".join(f"{v:g}" for v in x) if isinstance(x, list) else f"{x:g}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _verbs(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items())) or "none"


def rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The figures table: one row per figure, one column per N."""
    ok = [r for r in results["sizes"] if "error" not in r]
    header = ["figure"] + [f"N={r['n']}" for r in ok]
    table: list[list[str]] = []

    def row(label: str, fn: Any) -> None:
        cells = []
        for r in ok:
            try:
                cells.append(fn(r))
            except (KeyError, TypeError):
                cells.append("-")
        table.append([label, *cells])

    def lat(side: str, what: str) -> Any:
        return lambda r: " / ".join(_f(r[side][what][k], "", 3) for k in ("p50", "p99", "max"))

    def rat(what: str, k: str) -> Any:
        return lambda r: _r(ratio(r["operator"][what][k], r["baseline"][what][k]))

    row("apply -> children created, operator: p50 / p99 / max (s)", lat("operator", "children"))
    row("apply -> children created, raw SSA of `specserving render`: p50 / p99 / max (s)", lat("baseline", "children"))
    if any("children_samples" in r["operator"] for r in ok):
        row("apply -> children created, each apply alone in order (s): operator / raw SSA",
            lambda r: " ".join(f"{x:.3f}" for x in r["operator"]["children_samples"]) + " / " +
            " ".join(f"{x:.3f}" for x in r["baseline"]["children_samples"]) if "children_samples" in r["operator"]
            else "one burst")
    row("ratio operator / raw SSA: p50", rat("children", "p50"))
    row("ratio operator / raw SSA: p99", rat("children", "p99"))
    row("ratio operator / raw SSA: max (all N done)", rat("children", "max"))
    row("apply -> children created, since the object's own apply: p50 / max (s), operator / raw SSA",
        lambda r: f"{r['operator']['children_since_own_apply']['p50']:.3f} / "
                  f"{r['operator']['children_since_own_apply']['max']:.3f} / "
                  f"{r['baseline']['children_since_own_apply']['p50']:.3f} / "
                  f"{r['baseline']['children_since_own_apply']['max']:.3f}")
    row("kubectl's own apply, per object (ms): N SpecServings (operator) / 11N children (raw SSA)",
        lambda r: f"{_per_object(r['operator']):.1f} / {_per_object(r['baseline']):.1f}")
    row("the API server's calls to the webhook, apply -> all Ready (its histogram, buckets 5/25/100 ms): calls, "
        "mean / p50 / p99 (ms)",
        lambda r: f"{r['operator']['webhook_during_apply']['calls']:.0f}, "
                  f"{_f(r['operator']['webhook_during_apply']['mean_ms'], '', 1)} / "
                  f"{_f(r['operator']['webhook_during_apply']['p50_ms'], '', 1)} / "
                  f"{_f(r['operator']['webhook_during_apply']['p99_ms'], '', 1)}")
    row("apply -> Ready, operator: p50 / p99 / max (s)", lat("operator", "ready"))
    row("apply -> 3 Deployments available, raw SSA: p50 / p99 / max (s)", lat("baseline", "ready"))
    row("ratio Ready: p50 / p99", lambda r: f"{_r(ratio(r['operator']['ready']['p50'], r['baseline']['ready']['p50']))}"
        f" / {_r(ratio(r['operator']['ready']['p99'], r['baseline']['ready']['p99']))}")
    row("ratio Ready: max (all N Ready)", lambda r: _r(ratio(r["operator"]["ready"]["max"],
                                                             r["baseline"]["ready"]["max"])))
    row("kubectl scale sps 1->2 -> new decode pod Running: p50 / max (s)",
        lambda r: f"{_f(r['operator']['scale']['p50'], '', 3)} / {_f(r['operator']['scale']['max'], '', 3)}")
    row("kubectl scale deployment 1->2 (direct): p50 / max (s)",
        lambda r: f"{_f(r['baseline']['scale']['p50'], '', 3)} / {_f(r['baseline']['scale']['max'], '', 3)}")
    row("ratio scale: p50 / max", lambda r: f"{_r(ratio(r['operator']['scale']['p50'], r['baseline']['scale']['p50']))}"
        f" / {_r(ratio(r['operator']['scale']['max'], r['baseline']['scale']['max']))}")
    row("operator CPU, apply -> all Ready (s)", lambda r: _f(r["operator"]["cpu_seconds"]))
    row("operator CPU per SpecServing (ms)", lambda r: _f(1000 * r["operator"]["cpu_seconds"] / r["n"], "", 1))
    row("operator RSS: at start / peak (MiB)",
        lambda r: f"{r['operator']['rss_start_mib']:.0f} / {r['operator']['peak_rss_mib']:.0f}")
    row("operator requests, apply -> all Ready, by verb", lambda r: _verbs(r["operator"]["requests_by_verb"]))
    row("operator writes per SpecServing (its counter: APPLY, PATCH, POST, DELETE)",
        lambda r: _f(r["operator"]["writes_per_specserving"], "", 1))
    row("+ kopf's annotation PATCHes per SpecServing (API server count)",
        lambda r: _f(r["operator"]["kopf_annotation_patches"] / r["n"], "", 1))
    row("status writes per SpecServing", lambda r: _f(r["operator"]["status_writes"] / r["n"], "", 1))
    row("peak queues, apply -> all Ready: SpecServings waiting for a pass / API calls waiting (spec, follow-up, "
        "resync, Events)", _queues)
    row("child applies seen by the API server (APPLY on child kinds)",
        lambda r: _f(r["operator"]["child_applies_apiserver"], "", 0))
    row("idle window (s) / resync every (s) / passes",
        lambda r: f"{r['operator']['idle']['seconds']:g} / {r['operator']['idle']['resync_seconds']:g} / "
                  f"{r['operator']['idle']['passes']:.0f}")
    row("idle: operator requests / writes / status writes",
        lambda r: f"{r['operator']['idle']['operator_requests']:.0f} / {r['operator']['idle']['operator_writes']:.0f}"
                  f" / {r['operator']['idle']['status_writes']:.0f}")
    row("idle: API server APPLYs + SpecServing writes (all clients)",
        lambda r: _f(r["operator"]["idle"]["apiserver_applies_and_specserving_writes"], "", 0))
    row("idle: operator CPU (s)", lambda r: _f(r["operator"]["idle"]["cpu_seconds"]))

    def lws(fn: Any) -> Any:
        def cell(r: dict[str, Any]) -> str:
            p = r.get("peer") or {"error": "not run"}
            if "error" in p or "skipped" in p:
                return f"not measured: {p.get('error') or p.get('skipped')}"
            return str(fn(r, p))
        return cell

    row("LeaderWorkerSet v0.9.0 (Go) peer, N of them: apply -> both StatefulSets: p50 / p99 / max (s)",
        lws(lambda r, p: " / ".join(_f(p["statefulsets"][k], "", 3) for k in ("p50", "p99", "max"))))
    row("LeaderWorkerSet peer: apply -> both pods created / Available: p50 (s)",
        lws(lambda r, p: f"{_f(p['pods']['p50'], '', 3)} / {_f(p['available']['p50'], '', 3)}"))
    row("ratio operator children / LeaderWorkerSet StatefulSets: p50 / max; operator Ready / LWS Available: p50",
        lws(lambda r, p: f"{_r(ratio(r['operator']['children']['p50'], p['statefulsets']['p50']))} / "
                         f"{_r(ratio(r['operator']['children']['max'], p['statefulsets']['max']))}; "
                         f"{_r(ratio(r['operator']['ready']['p50'], p['available']['p50']))}"))
    row("LeaderWorkerSet manager: CPU (s) / peak RSS (MiB); operator's peak RSS over it",
        lws(lambda r, p: f"{_f(p['cpu_seconds'])} / {p['peak_rss_mib']:.0f}; "
                         f"{_r(ratio(r['operator']['peak_rss_mib'], p['peak_rss_mib']))}"))
    row("operator log lines with ERROR or Traceback", lambda r: str(r["operator"]["log_errors"]))
    row("wall time for this N (s)", lambda r: _f(r["seconds"], "", 0))
    return header, table


def _queues(r: dict[str, Any]) -> str:
    peak = r["operator"].get("queue_depth", {}).get("peak")
    if not peak:
        return "-"  # results from before the queues were sampled
    return (f"{peak['passes_queued']:.0f} / {peak['spec']:.0f}, {peak['follow_up']:.0f}, {peak['resync']:.0f}, "
            f"{peak['background']:.0f}")


def _per_object(side: dict[str, Any]) -> float:
    """kubectl's pace: from its marker line to its last object's line, per object."""
    lines = side["samples"]["lines"]
    return 1000 * (lines[-1] - lines[0]) / (len(lines) - 1)


def webhook_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The webhook table: one column per request rate."""
    rates = results.get("webhook", {}).get("rates", [])
    header = ["figure"] + [f"{w['rate']:g} requests/s" for w in rates]
    table: list[list[str]] = []

    def row(label: str, fn: Any) -> None:
        cells = []
        for w in rates:
            try:
                cells.append(fn(w))
            except (KeyError, TypeError):
                cells.append("-")
        table.append([label, *cells])

    def series(key: str) -> Any:
        return lambda w: (f"{_f(w[key]['p50_ms'], '', 1)} / {_f(w[key]['p99_ms'], '', 1)} / "
                          f"{_f(w[key]['max_ms'], '', 1)} ({w[key]['n']} requests at "
                          f"{_f(w[key]['achieved_rate'], '/s', 0)}, {w[key]['errors']} errors)")

    row("machine CPUs busy over the 2 s before the series / seconds waited for them to settle",
        lambda w: f"{w['cpu_busy_before']:.0%} / {w['quiet_wait_s']:.0f}")
    row("dry-run create through the API server and the webhook: p50 / p99 / max (ms)", series("webhook"))
    row("dry-run create, namespace the webhook does not cover: p50 / p99 / max (ms)", series("no_webhook"))
    row("the webhook adds: p50 / p99 (ms)", lambda w: f"{w['added_p50_ms']:.1f} / {w['added_p99_ms']:.1f}")
    row("ratio with / without the webhook: p50 / p99",
        lambda w: f"{_r(ratio(w['webhook']['p50_ms'], w['no_webhook']['p50_ms']))} / "
                  f"{_r(ratio(w['webhook']['p99_ms'], w['no_webhook']['p99_ms']))}")
    row("dry-run create through a no-op Go webhook (bench/floor.py): p50 / p99 / max (ms)", series("noop_webhook"))
    row("the no-op webhook adds (what any webhook costs this API server): p50 / p99 (ms)",
        lambda w: f"{w['noop_added_p50_ms']:.1f} / {w['noop_added_p99_ms']:.1f}")
    row("ours adds beyond the no-op webhook: p50 / p99 (ms)",
        lambda w: f"{w['beyond_noop_p50_ms']:.1f} / {w['beyond_noop_p99_ms']:.1f}")
    row("AdmissionReview straight to the webhook over HTTPS: p50 / p99 / max (ms)", series("webhook_direct"))
    row("the handler's own time (specserving_webhook_review_duration_seconds): p50 / p99 (ms)",
        lambda w: f"{_f(w['handler_p50_ms'], '', 2)} / {_f(w['handler_p99_ms'], '', 2)}")
    row("the API server's call to the webhook (its histogram, buckets 5/25/100 ms): p50 / p99 (ms)",
        lambda w: f"{_f(w['apiserver_call_p50_ms'], '', 1)} / {_f(w['apiserver_call_p99_ms'], '', 1)}")
    row("the API server's call to the no-op webhook (the same histogram): p50 / p99 (ms)",
        lambda w: f"{_f(w['noop_apiserver_call_p50_ms'], '', 1)} / {_f(w['noop_apiserver_call_p99_ms'], '', 1)}")
    return header, table


def targets(results: dict[str, Any]) -> list[list[str]]:
    ok = [r for r in results["sizes"] if "error" not in r]
    out: list[list[str]] = []

    def verdict(good: bool | None) -> str:
        return "-" if good is None else ("met" if good else "**missed**")

    for r in ok:
        o, b = r["operator"], r["baseline"]
        rs = [ratio(o["children"]["p50"], b["children"]["p50"]), ratio(o["children"]["p99"], b["children"]["p99"]),
              ratio(o["children"]["max"], b["children"]["max"])]
        # The target is at p50; p99 and max are shown beside it (the page's verdict until 2026-12-07 wanted
        # all three within 1.2x).
        good = None if rs[0] is None else rs[0] <= TARGETS["children"]
        out.append([f"apply -> children created within 1.2x of raw SSA at p50 (N={r['n']}, "
                    f"{o['children']['n']} / {b['children']['n']} samples)",
                    f"p50 {_r(rs[0])}, p99 {_r(rs[1])}, max {_r(rs[2])} ({o['children']['p50']:.3f} s vs "
                    f"{b['children']['p50']:.3f} s at p50)", verdict(good)])
    for r in ok:
        x = ratio(r["operator"]["scale"]["p50"], r["baseline"]["scale"]["p50"])
        out.append([f"kubectl scale -> new decode pods Running within 1.5x of scaling the Deployment (N={r['n']})",
                    f"p50 {_r(x)} ({r['operator']['scale']['p50']:.2f} s vs {r['baseline']['scale']['p50']:.2f} s)",
                    verdict(None if x is None else x <= TARGETS["scale"])])
    for r in ok:
        i = r["operator"]["idle"]
        out.append([f"zero writes on an idle resync (N={r['n']}, {i['seconds']:g} s, {i['passes']:.0f} passes)",
                    f"operator {i['operator_writes']:.0f}, API server {i['apiserver_applies_and_specserving_writes']:.0f}",
                    verdict(i["operator_writes"] == 0 and i["apiserver_applies_and_specserving_writes"] == 0)])
    big = [r for r in ok if r["n"] >= 1000]
    if big:
        r = big[-1]
        out.append([f"at most 200 MiB RSS with 1,000 SpecServings (N={r['n']})",
                    f"peak {r['operator']['peak_rss_mib']:.0f} MiB ({r['operator']['peak_rss_mib'] / 200:.2f}x)",
                    verdict(r["operator"]["peak_rss_mib"] <= TARGETS["rss_mib"])])
    elif ok:
        r = ok[-1]
        out.append(["at most 200 MiB RSS with 1,000 SpecServings",
                    f"not measured at N=1000; peak {r['operator']['peak_rss_mib']:.0f} MiB at N={r['n']}", "-"])
    rates = results.get("webhook", {}).get("rates", [])
    at = [w for w in rates if w["rate"] >= 100] or rates[-1:]
    for w in at:
        limit = TARGETS["webhook_p99_ms"]
        out.append([f"webhook p99 at most {limit:g} ms at {w['rate']:g} requests/s",
                    f"added p99 {w['added_p99_ms']:.1f} ms ({w['added_p99_ms'] / limit:.2f}x); straight to the "
                    f"webhook p99 {w['webhook_direct']['p99_ms']:.1f} ms "
                    f"({w['webhook_direct']['p99_ms'] / limit:.2f}x){_floor(w)}{_unsettled(results, w)}",
                    verdict(w["added_p99_ms"] <= TARGETS["webhook_p99_ms"]
                            and w["webhook_direct"]["p99_ms"] <= TARGETS["webhook_p99_ms"])])
    return out


def _floor(w: dict[str, Any]) -> str:
    """What a no-op webhook adds on the same API server in the same run: the part of the added p99 that is not
    ours. Pages before the floor was measured have none."""
    if "noop_added_p99_ms" not in w:
        return ""
    return (f"; a no-op Go webhook adds {w['noop_added_p99_ms']:.1f} ms p99 in the same run, and ours "
            f"{w['beyond_noop_p99_ms']:.1f} ms beyond it")


def _unsettled(results: dict[str, Any], w: dict[str, Any]) -> str:
    """A note for a webhook series that started on a busy machine (the quiet wait ran out)."""
    busy_below = results["settings"].get("webhook_quiet", {}).get("busy_below")
    busy = w.get("cpu_busy_before")
    if busy_below is None or busy is None or busy < busy_below:
        return ""
    return f"; measured on a busy machine (CPUs {busy:.0%} busy after {w['quiet_wait_s']:.0f} s of waiting)"


WEBHOOK_MODES = {"chart": "certificate files, as the Helm chart runs it",
                 "self": "a certificate it makes itself (self mode, as on local clusters)",
                 "none": "nothing: no webhook ran (an experiment, not a result: the chart always runs it)"}


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return "\n".join(lines)


METHOD = """\
`make bench` (`python -m bench --sizes 1,100,1000 --idle-seconds 60,60,600`) starts, for each N, its own local control plane
(`hack/cluster.sh up`, cluster `specserving-bench`, 2N+2 fake 8-GPU nodes from kwok, which also plays the
containers; the cluster is recreated when N changes) and on it:

1. **Baseline**: `specserving render` of N SpecServings (in process; checked byte-equal with the CLI on one
   object) applied with one `kubectl apply --server-side -f` in namespace `bench-base-N`; then `kubectl scale
   deployment/...-decode --replicas=2` on a few of them, one at a time. Its Deployments are then deleted to free
   the nodes.
2. **Webhook** (for the first N only: it does not depend on N): `specserving run --namespace bench-op-N` starts
   with the validating webhook as the Helm chart runs it: certificate files made by the bench, and a
   ValidatingWebhookConfiguration (limited to `bench-op-N`) that the bench applies. With `--webhook-mode self`
   the operator makes both, and so imports cryptography (8.8 MiB more RSS); pages before 2026-12-07 used that.
   At each rate, server-side dry-run creates of the same SpecServing go through the API server in `bench-op-N`
   (the API server calls the webhook), in `bench-base-N` (no webhook) and in `bench-floor-N` (a no-op webhook in
   Go's standard library, `bench/noopwebhook`, that decodes the review and admits it: what calling any webhook
   costs this API server), in alternating one-second blocks, and a fourth series posts AdmissionReviews straight
   to the webhook. Latency is from sending a request to its answer; the
   "achieved" rate says whether the client kept the schedule. Each rate first waits (up to
   `--webhook-quiet-seconds`) until the machine's CPUs are less than 25% busy over 2 s: a control plane that has
   just started spends its first minutes on its own work, and a series run then measured that (pages before
   2026-12-07 did not wait, and ran 10 s per series instead of 30).
3. **Operator**: N SpecServings (the seed example with 1 prefill and 1 decode replica: two whole GPU nodes each)
   in one `kubectl apply --server-side -f`, then `kubectl scale sps/... --replicas=2` on as many as the baseline
   scaled, then an idle window in which the operator resyncs every SpecServing several times. Its queues
   (SpecServings waiting for a pass, API calls waiting per urgency lane) are sampled from its /metrics every second
   from apply to all Ready (`queue_depth` in the JSON).
4. **Peer**: with the operator stopped, the LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0, Go,
   controller-runtime; built from its Go module and started with its CRDs and webhooks by `hack/cluster.sh lws-up`)
   gets N LeaderWorkerSets of one group of two pods each (no GPU) in one `kubectl apply --server-side -f` after a
   marker line: from that line to both StatefulSets (the leader's, then the workers', which LWS makes once the
   leader pod exists), both pods and the Available condition; its CPU and peak RSS from /proc. It is not the same
   work (2 direct children instead of 11, no image or Services), so its ratio reads as "what a Go controller on
   this control plane takes for a comparable fan-out", beside the ratio to raw SSA.

Timing is the same on both sides: the N objects go in one `kubectl apply --server-side -f FILE` whose first
document is a marker ConfigMap; kubectl prints a line per object as it applies it, and the marker's line starts
the clock for all N (so a figure for object i includes waiting behind the objects before it: kubectl's queue on
one side, the operator's on the other; the JSON file also has the times from each object's own apply request).
"Children created" is the arrival, at the bench's own watches, of the last of the object's 11 children; "Ready" is the SpecServing's Ready condition for
its generation (baseline: its three Deployments available at once); "scale" runs from starting `kubectl scale`
to the second decode pod Running and Ready, after a quiet second (for the operator: a second without a reconcile
pass), and back to one replica before the next sample. At N=1, one apply is one draw, so each side then applies
4 more instances (`--children-repeats`) alone, one at a time, timed the same way and deleted again (Deployments,
ReplicaSets and pods gone) before the next; N=1's children figures are over all 5. The first SpecServing of a
namespace and shape costs the operator a dry run that the later ones skip (reconcile/accepted.py), so the first
sample is its cold one, listed first. Operator CPU and peak RSS (VmHWM) come from /proc; its requests
from its own `specserving_api_requests_total` (which excludes kopf's watches and kopf's own annotation PATCHes,
counted apart from the API server's `apiserver_request_total`, which has no user-agent label, so API server
figures are for all clients). kwok plays the pods, so the times are the operator's and the control plane's,
not a model's load. The machine is shared with other jobs; both sides ran in the same run, one after the other.
"""


def write(results: dict[str, Any], md: Path, png: Path) -> str:
    header, body = rows(results)
    figures = markdown_table(header, body)
    target_table = markdown_table(["target", "measured", "verdict"], targets(results))
    webhook_table = markdown_table(*webhook_rows(results))
    m = results["machine"]
    env = (f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB memory, load average {m['loadavg_start']:.1f} at "
           f"the start and {m.get('loadavg_end', 0):.1f} at the end; Kubernetes {m.get('kubernetes', '?')} "
           f"(kube-apiserver, etcd, kwok from hack/cluster.sh), Python {m['python']}, kopf {m['kopf']}, kernel "
           f"{m['kernel']}; operator code at commit {m.get('revision', '?')}")
    failed = [r for r in results["sizes"] if "error" in r]
    st = results["settings"]
    text = [
        "# Benchmarks", "",
        f"Measured {results['started']} in {results['seconds'] / 60:.0f} min on {env}.", "",
        f"Settings: sizes {', '.join(map(str, st['sizes']))}; idle window {_per_size(st['idle_seconds'])} s with "
        f"a resync every {_per_size(st['resync_seconds'])} s; {st['scale_samples']} scale samples per side; "
        f"at N={st.get('children_repeats_at', 1)}, {st.get('children_repeats', 0)} more apply -> children samples per "
        f"side, each a new instance applied alone; webhook at "
        f"{', '.join(f'{x:g}' for x in st['webhook_rates'])} requests/s for {st['webhook_seconds']:g} s per series; "
        f"fake 8-GPU nodes for each N: {st['nodes']}; the webhook on "
        f"{WEBHOOK_MODES.get(st.get('webhook_mode', 'self'), st.get('webhook_mode'))}.", "",
        "## Targets", "", target_table, "",
        "## Every figure", "", figures, "",
        f"![apply latency against N]({png.name})", "",
        f"## The webhook (measured once, with the operator of N={results.get('webhook', {}).get('n', '?')})", "",
        webhook_table, "",
    ]
    if failed:
        text += ["## Sizes that did not finish", ""] + [f"- N={r['n']}: `{r['error']}`" for r in failed] + [""]
    text += ["## Method", "", METHOD]
    kept = ""
    if md.exists():
        old = md.read_text()
        if KEEP in old:
            kept = old.split(KEEP, 1)[1]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(text) + "\n" + KEEP + (kept if kept else "\n"))
    plot(results, png)
    return "\n".join(["Targets:", target_table, "", "Figures:", figures, "", "Webhook:", webhook_table])


def plot(results: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ok = [r for r in results["sizes"] if "error" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, what, title in ((axes[0], "children", "apply -> children created"), (axes[1], "ready", "apply -> Ready")):
        ns = [r["n"] for r in ok]
        if not ns:
            ax.text(0.5, 0.5, "no size finished", ha="center", va="center", transform=ax.transAxes)
            continue
        for side, label, color in (("operator", "operator", "tab:blue"),
                                   ("baseline", "raw SSA of rendered children", "tab:orange")):
            for q, style in (("p50", "-"), ("p99", "--")):
                ys = [r[side][what][q] for r in ok]
                ax.plot(ns, ys, style, marker="o", color=color, label=f"{label} {q}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labelled minor ticks overlap
        ax.set_xlabel("SpecServings applied at once (N)")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SpecServing operator vs server-side apply of the same manifests (local control plane, kwok)",
                 fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.report RESULTS.json --out-md FILE --out-png FILE`: write the page again from a JSON file."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    p.add_argument("results")
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-png", required=True)
    args = p.parse_args(argv)
    print(write(json.loads(Path(args.results).read_text()), Path(args.out_md), Path(args.out_png)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
