"""The `specserving` command: render, validate and print the CRD offline; run the operator.

Exit codes: 0 accepted, 1 refused (a SpecServing that validation refuses, schema errors included), 2 unreadable
or not a SpecServing (a missing file, not YAML, too large or deep, another kind). Bad input gets one line on stderr
naming the problem and no traceback; a traceback is a bug.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from specserving.problems import printable

EXIT_REFUSED = 1  # a SpecServing that validation refuses (schema, CEL or semantic errors)
EXIT_INVALID = 2  # input that is not a SpecServing at all: missing file, not YAML, too large, another kind


class InputError(Exception):
    """The user's input cannot be used; the message is the one line they see."""


def _dump_all(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=120)


# What one SpecServing file may be: far more than any real one (the seed example is 2 KiB, 40 levels would be odd),
# far less than what makes validation slow. Aliases count as often as they are expanded, so a "billion laughs"
# file is refused before anything walks it.
MAX_INPUT_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_EXPANDED_NODES = 100_000


def _check_shape(node: yaml.Node, path: str) -> None:
    """Refuse a YAML node graph that nests deeper than MAX_DEPTH, refers to itself, or expands (aliases
    included) to more than MAX_EXPANDED_NODES nodes."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(n: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels; a SpecServing is not")
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in open_nodes:
            raise InputError(f"{path}: a YAML alias refers to a node that contains it (a recursive document)")
        open_nodes.add(id(n))
        children: list[yaml.Node] = []
        if isinstance(n, yaml.SequenceNode):
            children = list(n.value)
        elif isinstance(n, yaml.MappingNode):
            children = [x for pair in n.value for x in pair]
        total = 1 + sum(size(c, depth + 1) for c in children)
        if total > MAX_EXPANDED_NODES:
            raise InputError(f"{path}: expands to more than {MAX_EXPANDED_NODES} YAML nodes (through aliases, "
                             "probably); refused")
        open_nodes.discard(id(n))
        sizes[id(n)] = total
        return total

    size(node, 0)


def _check_nesting(text: str, path: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH from the parser's event stream, which stops at the first level too
    many; composing first would recurse through all of them (a megabyte of "[" takes seconds)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels; a SpecServing is not")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def load_object(path: str) -> dict[str, Any]:
    """Read one SpecServing from a YAML file ('-' for stdin), bounded in size, depth and alias expansion."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a YAML file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise InputError(f"{path}: larger than {MAX_INPUT_BYTES // 1024} KiB; a SpecServing is a few KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        _check_nesting(text, path)
        nodes = [n for n in yaml.compose_all(text, Loader=yaml.SafeLoader) if n is not None]
        for node in nodes:
            _check_shape(node, path)
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read; a SpecServing is not") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise InputError(f"{path}: expected exactly one SpecServing object, found {len(docs)} documents")
    return docs[0]


def _validated(path: str) -> tuple[dict[str, Any], Any]:
    from specserving.validation import validate

    obj = load_object(path)
    return obj, validate(obj)


def cmd_validate(args: argparse.Namespace) -> int:
    _, report = _validated(args.file)
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in report.errors:
        print(f"error: {e}", file=sys.stderr)
    if report.errors:
        print(f"{args.file}: {len(report.errors)} error(s); nothing would be admitted", file=sys.stderr)
        return EXIT_INVALID if report.not_a_specserving else EXIT_REFUSED
    print(f"{args.file}: valid")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from specserving.rendering import render

    obj, report = _validated(args.file)
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if report.errors:
        for e in report.errors:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID if report.not_a_specserving else EXIT_REFUSED
    if args.namespace:
        obj.setdefault("metadata", {})["namespace"] = args.namespace
    image, warning = _build_placeholder(report.spec, args.build_registry)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(_dump_all(render(report.spec, obj["metadata"], image=image)))
    return 0


# A name that can never resolve (RFC 2606), so a placeholder rendered without a registry cannot be pulled by mistake.
PLACEHOLDER_REGISTRY = "build-registry.invalid"


def _build_placeholder(spec: Any, registry: str | None) -> tuple[Any, str | None]:
    """When the operator would build the fixed image, the pools' image as a placeholder (the tag the build pushes;
    the operator deploys its digest) and a warning naming the build; (None, None) when the base runs as-is."""
    from specserving.capabilities import load as load_capabilities
    from specserving.imagebuild import context
    from specserving.imagebuild.planning import BUILD, plan
    from specserving.rendering.image import ResolvedImage

    try:
        fix_version = context.load().fix_version
    except (context.ContextError, OSError, UnicodeDecodeError):
        fix_version = "unknown"
    ip = plan(spec, load_capabilities(), fix_version=fix_version,
              default_registry=registry or PLACEHOLDER_REGISTRY)
    if ip.decision != BUILD or not ip.target:
        return None, None
    where = "" if registry else f" (no --build-registry given: {PLACEHOLDER_REGISTRY} stands for it)"
    warning = (f"{ip.reason}. The operator builds images/sglang-pd FROM {ip.base} in a build Job (sps-build-...) "
               f"and runs the pools on the pushed image by digest; the pools below show {ip.target}{where} as a "
               f"placeholder (the operator names the build by the base's digest where its registry answers). "
               f"Running {ip.base} as-is would crash the first decode.")
    return ResolvedImage(ref=ip.target, sglang_version=ip.sglang_version, fix_applied=True), warning


def _live(kubeconfig: str | None, context: str | None, namespace: str, name: str) -> Any:
    """The SpecServing `namespace/name` as it runs: its spec, its pools' image, and the serving revision's
    replicas (from its workloads and its router Deployment)."""
    from specserving import API_VERSION, KIND, PLURAL
    from specserving.api.loading import spec_of
    from specserving.api.naming import child_name
    from specserving.kube import ApiError, Kube, Resource, StartupError, load_configuration
    from specserving.rendering import labels as L
    from specserving.rolloutplan import Current, live_image

    try:
        kube = Kube(load_configuration(kubeconfig, context))
        obj = kube.get(Resource(API_VERSION, KIND, PLURAL, True), namespace, name)
    except StartupError as exc:
        raise InputError(str(exc)) from None
    except ApiError as exc:
        if exc.not_found:
            raise InputError(f"--live: SpecServing {namespace}/{name} does not exist; drop --live to plan its "
                             "creation") from None
        raise InputError(f"--live: cannot read SpecServing {namespace}/{name}: {exc}") from None
    spec = spec_of(obj)
    deployments = Resource("apps/v1", "Deployment", "deployments", True)
    found = kube.request("GET", deployments.path(namespace),
                         query={"labelSelector": f"{L.INSTANCE}={name}"}).get("items", [])
    router = next((d for d in found if d["metadata"]["name"] == child_name(name, L.ROUTER)), None)
    serving = None
    if router is not None:
        serving = (router["spec"]["template"]["metadata"].get("labels") or {}).get(L.REVISION, "")
    replicas = {d["metadata"]["labels"].get(L.ROLE): int(d["spec"].get("replicas", 0)) for d in found
                if (d["metadata"].get("labels") or {}).get(L.REVISION, "") == serving
                and d["metadata"]["labels"].get(L.ROLE) in (L.PREFILL, L.DECODE)}
    return Current(spec, live_image(spec, obj.get("status") or {}), serving, replicas or None)


def cmd_plan(args: argparse.Namespace) -> int:
    from specserving.api.loading import spec_of
    from specserving.rendering.image import base_image
    from specserving.rolloutplan import Current, lines

    obj, report = _validated(args.file)
    if report.errors:
        for e in report.errors:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID if report.not_a_specserving else EXIT_REFUSED
    current = None
    if args.live:
        meta = obj.get("metadata") or {}
        current = _live(args.kubeconfig, args.context, args.namespace or meta.get("namespace") or "default",
                        meta.get("name", ""))
    elif args.from_file:
        old, old_report = _validated(args.from_file)
        if old_report.malformed:
            raise InputError(f"{args.from_file}: not a SpecServing: {old_report.errors[0]}")
        old_spec = spec_of(old)
        current = Current(old_spec, base_image(old_spec))
    print("\n".join(lines(report.spec, current)))
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from specserving.api.schema import crd

    sys.stdout.write(_dump_all([crd()]))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specserving.kube import StartupError
    from specserving.reconcile.runner import Options, run
    from specserving.webhook.runtime import WebhookOptions

    def path(value: str | None) -> Path | None:
        return Path(value) if value else None

    webhook = WebhookOptions(port=args.webhook_port, listen=args.webhook_listen, advertise=args.webhook_advertise,
                             certfile=path(args.webhook_certfile), keyfile=path(args.webhook_keyfile),
                             cert_dir=path(args.webhook_cert_dir), configuration=args.webhook_configuration,
                             configuration_name=args.webhook_configuration_name)
    opts = Options(namespaces=args.namespace or [], all_namespaces=args.all_namespaces, kubeconfig=args.kubeconfig,
                   context=args.context, liveness=args.liveness, metrics_port=args.metrics_port,
                   metrics_address=args.metrics_address, peering=args.peering, priority=args.priority,
                   resync_seconds=args.resync_seconds, probe_load=args.probe_load, verbose=args.verbose,
                   debug=args.debug, webhook=webhook, build_registry=args.build_registry,
                   build_push_secret=args.build_push_secret, buildkit_image=args.buildkit_image,
                   build_context=args.build_context, build_insecure_registries=args.build_insecure_registry or [],
                   build_node_selector=args.build_node_selector or [], build_tolerations=args.build_toleration or [],
                   build_resources=args.build_resources, base_digests=args.base_digests,
                   read_pull_secrets=args.read_pull_secrets, serving_checks=args.serving_checks == "On",
                   policy=_policy(args))
    try:
        return run(opts)
    except StartupError as exc:
        print(f"specserving: {exc}", file=sys.stderr)
        return 1


def _policy(args: argparse.Namespace) -> Any:
    from specserving.policy import ServingPolicy

    def listed(values: list[str] | None) -> tuple[str, ...] | None:
        return tuple(v for value in values for v in value.split(",") if v) if values is not None else None

    host_network = () if args.deny_host_network else listed(args.allow_host_network_in)
    for prefix in args.allow_host_path or []:
        if not prefix.startswith("/"):
            raise InputError(f"--allow-host-path {prefix!r}: give an absolute node path, for example /data2")
    return ServingPolicy(host_path_prefixes=listed(args.allow_host_path) or (), host_network_namespaces=host_network,
                         rdma_resources=listed(args.allow_rdma_resource),
                         multus_networks=listed(args.allow_multus_network))


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run the operator (kopf) against the cluster of the kubeconfig or in-cluster")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", action="append", metavar="NS",
                       help="watch SpecServings in this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch SpecServings cluster-wide")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", metavar="URL",
                   help="serve kopf's liveness endpoint at URL; '' turns it off (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=9090, metavar="PORT",
                   help="serve Prometheus metrics on PORT; 0 turns them off (default %(default)s)")
    p.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDR",
                   help="address for the metrics server (default %(default)s)")
    p.add_argument("--peering", metavar="NAME",
                   help="take part in kopf peering under NAME (default: standalone, no peering)")
    p.add_argument("--priority", default="0", metavar="N",
                   help="peering priority: an integer, or 'random' (replicas with distinct priorities: the highest "
                        "runs, the others pause; default %(default)s)")
    p.add_argument("--resync-seconds", type=float, default=600.0, metavar="S",
                   help="converge every SpecServing every S seconds; costs no request when in sync; 0 turns it "
                        "off (default %(default)s)")
    p.add_argument("--serving-checks", choices=["On", "Off"], default="On",
                   help="after each rollout, send one generate request through each router Service and report it "
                        "in the ServingVerified condition (spec.router.servingCheck switches one SpecServing off; "
                        "Off: no checks, no condition) (default %(default)s)")
    p.add_argument("--no-load-probe", dest="probe_load", action="store_false",
                   help="on decode scale-down, do not read running requests from the pods' /metrics")
    w = p.add_argument_group("admission webhook")
    w.add_argument("--webhook-port", type=int, default=0, metavar="PORT",
                   help="serve the validating webhook over HTTPS on PORT; 0 (default) serves none")
    w.add_argument("--webhook-listen", default="127.0.0.1", metavar="ADDR",
                   help="address the webhook listens on (default %(default)s)")
    w.add_argument("--webhook-advertise", metavar="HOST",
                   help="host the API server calls in self mode, and the certificate's name (default: the listen "
                        "address, or localhost for 0.0.0.0)")
    w.add_argument("--webhook-certfile", metavar="FILE", help="serving certificate (PEM); with --webhook-keyfile")
    w.add_argument("--webhook-keyfile", metavar="FILE", help="serving key (PEM)")
    w.add_argument("--webhook-cert-dir", metavar="DIR",
                   help="where a self-signed CA and certificate are written (default: a new temporary folder)")
    w.add_argument("--webhook-configuration", choices=["self", "none"], default="self",
                   help="self: apply the ValidatingWebhookConfiguration with our URL and CA (local clusters); "
                        "none: another owner (the Helm chart) manages it (default %(default)s)")
    w.add_argument("--webhook-configuration-name", default="specserving-validating", metavar="NAME",
                   help="name of the ValidatingWebhookConfiguration in self mode (default %(default)s)")
    from specserving.imagebuild.job import DEFAULT_BUILDKIT_IMAGE

    sp = p.add_argument_group("serving-pod policy (what a SpecServing may ask of a node; chart servingPolicy.*)")
    sp.add_argument("--allow-host-path", action="append", metavar="DIR",
                    help="a node folder model volumes may mount with hostPath, with everything below it "
                         "(repeatable or comma-separated; default: none)")
    sp.add_argument("--allow-host-network-in", action="append", metavar="NS",
                    help="allow hostNetwork only in these namespaces (repeatable; default: every namespace)")
    sp.add_argument("--deny-host-network", action="store_true", help="allow hostNetwork in no namespace")
    sp.add_argument("--allow-rdma-resource", action="append", metavar="NAME",
                    help="an RDMA extended resource pods may request (repeatable; default: any)")
    sp.add_argument("--allow-multus-network", action="append", metavar="NAME",
                    help="a Multus network pods may attach (repeatable; default: any)")
    b = p.add_argument_group("image builds")
    b.add_argument("--build-registry", metavar="REPO",
                   help="default repository the fixed serving image is pushed to, e.g. registry.example.com/ml "
                        "(a SpecServing's spec.image.build.registry overrides it; default: none)")
    b.add_argument("--build-push-secret", metavar="NAME",
                   help="default dockerconfigjson Secret, in each SpecServing's namespace, that build Jobs push "
                        "with (spec.image.build.pushSecretRef overrides it); mounted by name, never read")
    b.add_argument("--buildkit-image", metavar="IMAGE", default=DEFAULT_BUILDKIT_IMAGE,
                   help="rootless BuildKit image of build Jobs; pin a digest (default %(default)s)")
    b.add_argument("--build-context", metavar="DIR",
                   help="the images/sglang-pd build context (default: $SPECSERVING_BUILD_CONTEXT, the operator "
                        "image's /opt/specserving/sglang-pd, or this checkout's)")
    b.add_argument("--build-insecure-registry", action="append", metavar="HOST[:PORT]",
                   help="a registry that build Jobs (pull and push) and base-digest lookups reach over plain HTTP "
                        "(repeatable; for in-cluster registries without TLS)")
    b.add_argument("--build-node-selector", action="append", metavar="KEY=VALUE",
                   help="a node label build pods require (repeatable)")
    b.add_argument("--build-toleration", action="append", metavar="KEY[=VALUE]:EFFECT",
                   help="a taint build pods tolerate (repeatable; no VALUE tolerates any value)")
    b.add_argument("--build-resources", metavar="JSON",
                   help='the build container\'s resources (default {"requests":{"cpu":"2","memory":"4Gi"},'
                        '"limits":{"memory":"16Gi"}})')
    b.add_argument("--base-digests", choices=["Required", "BestEffort", "Off"], default="BestEffort",
                   help="key builds by the digest the base tag points to, read from its registry: Required "
                        "blocks a build until it resolves, BestEffort falls back to the tag with a Warning event, "
                        "Off keys by the tag (default %(default)s)")
    b.add_argument("--read-pull-secrets", action="store_true",
                   help="read the Secrets a SpecServing names in spec.image.pullSecrets to resolve a private base's "
                        "digest (needs get on Secrets; default: anonymous lookups only)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log more: kopf's line per handled object and the webhook's line per request")
    p.add_argument("--debug", action="store_true", help="log everything, kopf's internals included")
    p.set_defaults(func=cmd_run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserving", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("render", help="print every manifest of a SpecServing as multi-document YAML")
    p.add_argument("-f", "--file", required=True, help="the SpecServing YAML file ('-' for stdin)")
    p.add_argument("-n", "--namespace", help="set the namespace of the rendered objects")
    p.add_argument("--build-registry", metavar="REPO",
                   help="the operator's --build-registry, for the placeholder image of a SpecServing that needs the "
                        "fixed image built (spec.image.build.registry overrides it)")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("validate", help="print every error with its field path; exit 1 when there are errors")
    p.add_argument("-f", "--file", required=True, help="the SpecServing YAML file ('-' for stdin)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("plan", help="print whether a change rolls out a new PD-contract revision, why, and its "
                                    "steps (the operator's own planner)")
    p.add_argument("-f", "--file", required=True, help="the new SpecServing YAML file ('-' for stdin)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--live", action="store_true",
                       help="compare with the SpecServing of the same name in the cluster, and its running pools")
    where.add_argument("--from", dest="from_file", metavar="OLD",
                       help="compare with the SpecServing in file OLD, as if it were running as its spec says")
    p.add_argument("-n", "--namespace", help="with --live: the namespace (default: the file's, else default)")
    p.add_argument("--kubeconfig", help="with --live: kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="with --live: kubeconfig context")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("crd", help="print the SpecServing CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)
    _add_run(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as exc:
        # One line, whatever the parser's message or the file's name holds.
        print(f"specserving: {printable(' '.join(str(exc).split()))}", file=sys.stderr)
        return EXIT_INVALID
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
