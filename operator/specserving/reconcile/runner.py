"""`specserving run`: check that the cluster can be used, serve metrics, then run kopf until a signal stops it."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specserving import API_VERSION, KIND, PLURAL
from specserving.kube import ApiError, Kube, StartupError, load_configuration
from specserving.metrics import Metrics
from specserving.reconcile.image import BuildConfig
from specserving.policy import ServingPolicy
from specserving.webhook.runtime import WebhookOptions

CRD_FILE = "crds/specserving.io_specservings.yaml"


@dataclass
class Options:
    """What `specserving run` was asked to do (the CLI's flags)."""

    namespaces: list[str] = field(default_factory=list)
    all_namespaces: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    liveness: str | None = "http://0.0.0.0:8080/healthz"
    metrics_port: int = 9090
    metrics_address: str = "0.0.0.0"
    peering: str | None = None  # None: standalone (no peering)
    priority: str = "0"  # an integer, or "random"
    resync_seconds: float = 600.0
    probe_load: bool = True
    verbose: bool = False
    debug: bool = False
    # In-cluster image builds: the default registry and push Secret (a SpecServing's spec.image.build overrides
    # them), the BuildKit image, and the build context (default: see imagebuild.context.default_directory).
    build_registry: str | None = None
    build_push_secret: str | None = None
    buildkit_image: str | None = None
    build_context: str | None = None
    # Plain-HTTP registries, the build pod's placement and resources, and how base tags are resolved to digests.
    build_insecure_registries: list[str] = field(default_factory=list)
    build_node_selector: list[str] = field(default_factory=list)
    build_tolerations: list[str] = field(default_factory=list)
    build_resources: str | None = None
    base_digests: str = "BestEffort"
    read_pull_secrets: bool = False
    # ServingVerified: one generate request through each router Service after each rollout (reconcile/serving.py).
    serving_checks: bool = True
    webhook: WebhookOptions = field(default_factory=WebhookOptions)
    # The cluster admin's serving-pod policy (policy.py): the webhook and the reconciler both enforce it.
    policy: ServingPolicy = field(default_factory=ServingPolicy)


def preflight(kube: Kube) -> None:
    """The API server answers, accepts our credentials, and serves the SpecServing CRD."""
    try:
        served = kube.resource(API_VERSION, KIND)
    except ApiError as exc:
        if exc.status == 0:
            raise StartupError(f"cannot reach the Kubernetes API server at {kube.host}: {exc.message}") from None
        if exc.status in (401, 403):
            raise StartupError(f"the API server at {kube.host} refused our credentials ({exc.status} "
                               f"{exc.reason}): {exc.message}") from None
        raise StartupError(f"the API server at {kube.host} failed discovery of {API_VERSION}: {exc}") from None
    if served is None:
        raise StartupError(f"the SpecServing CRD ({PLURAL}.{API_VERSION.split('/')[0]}, {API_VERSION}) is not "
                           f"installed in the cluster at {kube.host}: kubectl apply -f {CRD_FILE}")


def build_config(opts: Options) -> BuildConfig:
    """The build settings, with the build context loaded once (and so the fix's version fixed) for the process."""
    from specserving.api.types import BuildSpec, LocalObjectReference
    from specserving.imagebuild import context
    from specserving.imagebuild.job import DEFAULT_BUILDKIT_IMAGE, DEFAULT_RESOURCES, BuildSettings
    from specserving.registry import Resolver
    from specserving.reconcile.image import BASE_DIGEST_MODES, OFF

    try:
        ctx = context.load(Path(opts.build_context) if opts.build_context else None)
    except (context.ContextError, OSError, UnicodeDecodeError) as exc:
        hint = "" if opts.build_context else " (or pass --build-context DIR)"
        raise StartupError(f"cannot load the image build context: {exc}{hint}") from None
    patterns = {f.name: f.metadata["pattern"] for f in dataclasses.fields(BuildSpec)}
    if opts.build_registry and not re.fullmatch(patterns["registry"], opts.build_registry):
        raise StartupError(f"--build-registry must be a repository such as registry.example.com/ml, not "
                           f"{opts.build_registry!r}")
    name_pattern = next(f.metadata["pattern"] for f in dataclasses.fields(LocalObjectReference) if f.name == "name")
    if opts.build_push_secret and not re.fullmatch(name_pattern, opts.build_push_secret):
        raise StartupError(f"--build-push-secret must be a Secret name, not {opts.build_push_secret!r}")
    settings = BuildSettings(
        buildkit_image=opts.buildkit_image or DEFAULT_BUILDKIT_IMAGE,
        insecure_registries=tuple(_hosts(opts.build_insecure_registries)),
        node_selector=dict(_pair("--build-node-selector", v) for v in opts.build_node_selector),
        tolerations=tuple(_toleration(v) for v in opts.build_tolerations),
        resources=_resources(opts.build_resources) if opts.build_resources else DEFAULT_RESOURCES)
    if opts.base_digests not in BASE_DIGEST_MODES:
        raise StartupError(f"--base-digests must be one of {', '.join(BASE_DIGEST_MODES)}, not {opts.base_digests!r}")
    resolver = None if opts.base_digests == OFF else Resolver(insecure=settings.insecure_registries)
    return BuildConfig(context=ctx, registry=opts.build_registry or None, push_secret=opts.build_push_secret or None,
                       settings=settings, resolver=resolver, base_digests=opts.base_digests,
                       read_pull_secrets=opts.read_pull_secrets)


def _hosts(values: list[str]) -> list[str]:
    for v in values:
        if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", v):
            raise StartupError(f"--build-insecure-registry takes a registry host[:port] such as "
                               f"registry.local:5000, not {v!r}")
    return values


def _pair(flag: str, value: str) -> tuple[str, str]:
    key, eq, val = value.partition("=")
    if not eq or not re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9_.-]+", key):
        raise StartupError(f"{flag} takes KEY=VALUE (a label), not {value!r}")
    return key, val


def _toleration(value: str) -> dict[str, str]:
    """KEY[=VALUE]:EFFECT, as kubectl taint writes a taint; no VALUE means operator Exists."""
    head, colon, effect = value.rpartition(":")
    if not colon or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
        raise StartupError(f"--build-toleration takes KEY[=VALUE]:EFFECT (EFFECT NoSchedule, PreferNoSchedule or "
                           f"NoExecute), not {value!r}")
    key, eq, val = head.partition("=")
    out = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
    if eq:
        out["value"] = val
    return out


def _resources(text: str) -> dict[str, Any]:
    from specserving.imagebuild.job import DEFAULT_RESOURCES

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StartupError(f"--build-resources must be JSON such as "
                           f"{json.dumps(DEFAULT_RESOURCES, separators=(',', ':'))}: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - {"requests", "limits"} or not all(
            isinstance(v, dict) and all(isinstance(q, str | int) for q in v.values()) for v in doc.values()):
        raise StartupError("--build-resources must be a JSON object with only requests and limits, each a map of "
                           f"resource name to quantity, not {text!r}")
    return {kind: {name: str(q) for name, q in amounts.items()} for kind, amounts in doc.items()}


def serve_metrics(metrics: Metrics, port: int, address: str) -> None:
    from prometheus_client import start_http_server

    try:
        start_http_server(port, addr=address, registry=metrics.registry)
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from None


def _priority(value: str) -> int:
    if value == "random":
        return random.randint(1, 2**31 - 1)
    try:
        return int(value)
    except ValueError:
        raise StartupError(f"--priority must be an integer or 'random', not {value!r}") from None


def run(opts: Options) -> int:
    """Run the operator in the foreground; returns the exit code. Startup problems raise StartupError."""
    import kopf

    from specserving.reconcile.controller import Controller
    from specserving.reconcile.handlers import build_registry

    if bool(opts.namespaces) == opts.all_namespaces:
        raise StartupError("pass either --namespace NS (repeatable) or --all-namespaces")
    priority = _priority(opts.priority)
    kopf.configure(verbose=opts.verbose, debug=opts.debug)
    logging.getLogger("specserving").setLevel(logging.DEBUG if opts.debug else logging.INFO)
    if not (opts.verbose or opts.debug):
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per handled watch event
        logging.getLogger("urllib3").setLevel(logging.ERROR)  # retries end in an ApiError we report ourselves
        # aiohttp logs every request the webhook serves at INFO: one line per admission review, which at 100 reviews/s
        # buried everything else (502 of 517 lines in a 500-SpecServing burst) and cost each review a formatted line.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    metrics = Metrics()
    kube = Kube(load_configuration(opts.kubeconfig, opts.context), count=metrics.count_request)
    preflight(kube)
    build = build_config(opts)
    if opts.metrics_port:
        serve_metrics(metrics, opts.metrics_port, opts.metrics_address)
    controller = Controller(kube, metrics, probe_load=opts.probe_load, build=build,
                            serving_checks=opts.serving_checks, policy=opts.policy)
    registry = build_registry(controller, resync_seconds=opts.resync_seconds, namespaces=opts.namespaces)
    from specserving.webhook.handlers import WebhookMetrics
    from specserving.webhook.runtime import install

    install(registry, opts.webhook, kube, WebhookMetrics(metrics.registry), namespaces=opts.namespaces,
            policy=opts.policy)
    logging.getLogger("specserving").info("serving-pod policy: %s", opts.policy)
    scope = "all namespaces" if opts.all_namespaces else "namespace(s) " + ", ".join(opts.namespaces)
    logging.getLogger("specserving").info("watching SpecServings in %s on %s", scope, kube.host)
    logging.getLogger("specserving").info(
        "image builds: fix version %s, registry %s, BuildKit image %s", build.fix_version,
        build.registry or "(none: each SpecServing that needs a build must set spec.image.build.registry)",
        build.settings.buildkit_image)
    # What start-up made (kopf, the kubernetes client's models, the capability table, the CRD schema: about 100,000
    # objects) lives as long as the process. Frozen, the cyclic garbage collector stops walking it on every full
    # collection: one took 40-50 ms on this 2-core machine, a pause of the event loop that the webhook's answers
    # and every reconcile wait out.
    gc.collect()
    gc.freeze()
    kopf.run(
        registry=registry,
        standalone=opts.peering is None,
        peering_name=opts.peering,
        priority=priority,
        clusterwide=opts.all_namespaces,
        namespaces=opts.namespaces,
        liveness_endpoint=opts.liveness or None,
    )
    return 0
