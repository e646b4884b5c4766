"""Validation of a SpecServing as pure functions: every error with its field path and fix, warnings apart.

Rules have one home each. Shape (types, enums, bounds, unknown fields) and local cross-field invariants live in
the CRD (schema and CEL, generated from api/types.py); `validate` re-applies them offline so the CLI gives the
apiserver's answer without a cluster. The rules that need knowledge the CRD cannot hold live here: the
PD-decode builder table per SGLang version, SGLang's own start-up rules, flags the renderer owns.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from specserving import API_VERSION, KIND
from specserving.api import structural
from specserving.api.loading import defaulted, schema
from specserving.api.parsing import from_dict
from specserving.api.types import SpecServingSpec
from specserving.capabilities import NEEDS_FIX, UNKNOWN_VERSION, CapabilityTable, load, version_key
from specserving.policy import ServingPolicy, check_policy
from specserving.problems import Problem, Report
from specserving.rendering import router
from specserving.command_lines import UserSettings, check_command_lines
from specserving.rendering.args import DIST_INIT_PORT
from specserving.rendering.labels import DECODE, PREFILL
from specserving.rendering.pods import OWNED_ENV
from specserving.rendering.image import sglang_version

CRASH = "'NoneType' object has no attribute 'prepare_for_decode'"
# SGLang's start-up rules under DP attention, read from each version's speculative argument hooks
# (docs/decode-path.md): the MoE all-to-all backends DSPARK accepts from each version on, and the first
# version that runs DFLASH under DP attention on CUDA.
DSPARK_DP_MOE_A2A = (("0.5.16", ("none",)), ("0.5.18", ("none", "megamoe")), ("0.5.21", ("none", "megamoe", "mori")))
DFLASH_DP_ATTENTION_FROM = "0.5.23"


def _fmt(algs: frozenset[str] | set[str]) -> str:
    return ", ".join(sorted(algs)) or "none"


def check_pd_builder(spec: SpecServingSpec, table: CapabilityTable) -> Report:
    """The decode pool's algorithm must have a PD-decode draft-input builder in the image's SGLang."""
    report = Report()
    path = "spec.speculative.algorithm"
    alg = spec.speculative.algorithm
    version = sglang_version(spec)
    may_build = spec.image.build.policy == "IfNeeded"
    if version is None:
        report.warnings.append(Problem("spec.image.sglangVersion", (
            f"cannot tell the SGLang version from image {spec.image.base!r}; set spec.image.sglangVersion "
            f"(for example \"0.5.23\") so that {alg} can be checked for a PD-decode builder"
            + ("; until then the build probe decides" if may_build else ""))))
        return report
    verdict = table.verdict(version, alg, with_fix=may_build)
    if verdict.kind == UNKNOWN_VERSION:
        report.warnings.append(Problem("spec.image.sglangVersion", (
            f"SGLang {version} is not in the capability table (known: {', '.join(sorted(table.versions, key=version_key))}); "
            + ("the build probe will decide whether it has a PD-decode builder for " + alg if may_build else
               f"nothing proves it has a PD-decode builder for {alg}: its first decode may crash with {CRASH}"))))
        return report
    if verdict.runs:
        return report
    builders = verdict.builders
    if not verdict.knows_algorithm:
        first = table.earliest_with(alg, with_fix=True)
        reason = f"SGLang {version} does not know the algorithm {alg}"
        reason += f" (it first appears with a PD-decode builder in {first})" if first else ""
    else:
        reason = (f"SGLang {version} has no PD-decode draft-input builder for {alg}"
                  f"{'' if may_build else ' in the base image'}, so the first decode would crash with {CRASH}")
    ways = []
    if not may_build and verdict.kind == NEEDS_FIX:
        ways.append("set spec.image.build.policy to IfNeeded so the operator builds the fixed image")
    ways.append(f"choose an algorithm with a builder in {version}: {_fmt(builders)}")
    newest = table.latest_with(alg, with_fix=False)
    if newest and version_key(newest) > version_key(version):
        oldest = min((v for v, c in table.versions.items()
                      if alg in c.upstream and version_key(v) > version_key(version)), key=version_key)
        ways.append(f"or upgrade the image to SGLang {oldest} or later, whose own builder covers {alg}")
    report.errors.append(Problem(path, f'Unsupported value: "{alg}": {reason}; algorithms with one: '
                                       f"{_fmt(builders)}. Fix: {'; '.join(ways)}"))
    return report


def _at_least(version: str, floor: str) -> bool:
    return version_key(version) >= version_key(floor)


def dspark_dp_moe_a2a(version: str) -> tuple[str, ...]:
    """The --moe-a2a-backend values SGLang `version` accepts for DSPARK under DP attention."""
    allowed: tuple[str, ...] = ()
    for floor, backends in DSPARK_DP_MOE_A2A:
        if _at_least(version, floor):
            allowed = backends
    return allowed


def check_sglang_startup_rules(spec: SpecServingSpec, table: CapabilityTable) -> Report:
    """SGLang's own refusals at start-up, per version, caught before a GPU node is spent on them.

    Versions the capability table does not know are left to SGLang (admission warns about them already).
    """
    report = Report()
    alg, eng = spec.speculative.algorithm, spec.engine
    version = sglang_version(spec)
    if version is None or table.lookup(version) is None or not eng.enable_dp_attention:
        return report
    # From 0.5.18 SGLang applies its DP checks only when attention really is split (dp > 1).
    dp_split = eng.dp > 1 or not _at_least(version, "0.5.18")
    if alg == "DFLASH" and not _at_least(version, DFLASH_DP_ATTENTION_FROM):
        report.errors.append(Problem("spec.engine.enableDpAttention", (
            f"Invalid value: true: SGLang {version} refuses DFLASH under DP attention on CUDA (allowed from "
            f"{DFLASH_DP_ATTENTION_FROM}); set enableDpAttention: false or upgrade SGLang")))
    elif alg in ("DSPARK", "DFLASH") and dp_split and not eng.enable_dp_lm_head:
        report.errors.append(Problem("spec.engine.enableDpLmHead", (
            f"Invalid value: false: SGLang {version} refuses {alg} under DP attention without "
            "--enable-dp-lm-head; set enableDpLmHead: true or enableDpAttention: false")))
    if alg == "DSPARK" and dp_split:
        allowed = dspark_dp_moe_a2a(version)
        backend = eng.moe_a2a_backend or "none"  # SGLang's default
        if not allowed:
            report.errors.append(Problem("spec.engine.enableDpAttention", (
                f"Invalid value: true: SGLang {version} refuses DSPARK under DP attention whatever the "
                "--moe-a2a-backend; set enableDpAttention: false or use a newer SGLang")))
        elif backend not in allowed:
            report.errors.append(Problem("spec.engine.moeA2aBackend", (
                f'Unsupported value: "{backend}": SGLang {version} refuses DSPARK under DP attention with this '
                f"--moe-a2a-backend; use one of {', '.join(allowed)}")))
    return report


# What a Kubernetes EnvVar may hold (core/v1), and the sources of its valueFrom.
ENV_VAR_KEYS = ("name", "value", "valueFrom")
ENV_SOURCES = ("configMapKeyRef", "fieldRef", "fileKeyRef", "resourceFieldRef", "secretKeyRef")
# Kubernetes 1.34+ (RelaxedEnvironmentVariableValidation): printable ASCII but '='.
ENV_NAME = re.compile(r"[\x20-\x3c\x3e-\x7e]+")


def _check_env_entry(at: str, entry: Any) -> list[Problem]:
    """One EnvVar as the API server will type it: a Deployment with anything else is refused at apply (a 500
    from server-side apply for a wrong type), after admission said yes."""
    if not isinstance(entry, dict):
        return [Problem(at, "Invalid value: an env entry is an object: {name: FOO, value: \"1\"} or {name: FOO, "
                            "valueFrom: {...}}")]
    problems = [Problem(f"{at}.{key}", f"Unsupported value: {key!r}: an env entry has only "
                                       f"{', '.join(ENV_VAR_KEYS)}; remove it")
                for key in entry if key not in ENV_VAR_KEYS]
    name = entry.get("name")
    if name is None or name == "":
        problems.append(Problem(f"{at}.name", "Required value: every env entry needs a name"))
    elif not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        problems.append(Problem(f"{at}.name", (
            f"Invalid value: {json.dumps(name)}: an environment variable name is a string of printable ASCII "
            "characters other than '='" + ("; quote it" if isinstance(name, (bool, int, float)) else ""))))
    value, source = entry.get("value"), entry.get("valueFrom")
    if value is not None and not isinstance(value, str):
        problems.append(Problem(f"{at}.value", (
            f"Invalid value: {json.dumps(value)}: an env value is a string"
            + (f"; quote it ({json.dumps(json.dumps(value))})" if isinstance(value, (bool, int, float)) else ""))))
    if source is not None:
        sources = [k for k in source if k in ENV_SOURCES] if isinstance(source, dict) else []
        if not isinstance(source, dict) or len(sources) != 1 or len(source) != 1 \
                or not isinstance(source[sources[0]], dict):
            problems.append(Problem(f"{at}.valueFrom", (
                f"Invalid value: valueFrom names exactly one source object, one of {', '.join(ENV_SOURCES)}")))
        elif value:
            problems.append(Problem(f"{at}.value", "Forbidden: value and valueFrom are exclusive; keep one"))
    return problems


def check_env(spec: SpecServingSpec) -> Report:
    """Each env entry is a Kubernetes EnvVar, set once per list, and not one the operator sets (command lines:
    command_lines.check_command_lines). A pool's entry replaces the engine-wide one of its name, with a warning."""
    report = Report()
    engine_names: dict[str, str] = {}
    for path, env in (("spec.engine.env", spec.engine.env), ("spec.prefill.env", spec.prefill.env),
                      ("spec.decode.env", spec.decode.env)):
        seen: dict[str, str] = {}
        for i, entry in enumerate(env or []):
            at = f"{path}[{i}]"
            problems = _check_env_entry(at, entry)
            report.errors.extend(problems)
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or any(p.path == f"{at}.name" for p in problems):
                continue
            if name in OWNED_ENV:
                report.errors.append(Problem(f"{at}.name", (
                    f'Forbidden: "{name}" is set by {OWNED_ENV[name]}; remove it from env (the operator\'s value '
                    "would be silently replaced)")))
            elif name in seen:
                report.errors.append(Problem(f"{at}.name", (
                    f'Duplicate value: "{name}" is already set by {seen[name]}; set each variable once per list')))
            elif name in engine_names and path != "spec.engine.env":
                report.warnings.append(Problem(f"{at}.name", (
                    f'"{name}" replaces {engine_names[name]} in this pool\'s pods')))
            seen.setdefault(name, at)
        if path == "spec.engine.env":
            engine_names = seen
    return report


CONTEXT_LENGTH_FLAG = "--context-length"
PP_SIZE_FLAG = "--pp-size"
# The algorithms SGLang's _handle_eagle_family configures (speculative_hook.py, 0.5.14 to 0.5.23).
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
ADAPTIVE_FLAG = "--speculative-adaptive"


def _describe(setting: tuple[str, str] | None) -> str:
    return f"{setting[0]} sets {setting[1]!r}" if setting else "it is unset (SGLang's default)"


def check_pd_symmetric(spec: SpecServingSpec, table: CapabilityTable) -> Report:
    """Flags SGLang's PD handshake requires to be equal on both roles must not differ between the pools'
    extraArgs: the decode pod would fail its first transfer (or hang waiting for it) instead of at apply."""
    report = Report()
    version = sglang_version(spec)
    where = f"SGLang {version}" if table.lookup(version) else "SGLang"
    prefill_settings, decode_settings = UserSettings(spec, PREFILL), UserSettings(spec, DECODE)
    for flag in (*table.symmetric_flags(version), CONTEXT_LENGTH_FLAG):
        prefill = prefill_settings.of(flag)
        decode = decode_settings.of(flag)
        if (prefill and prefill[1]) == (decode and decode[1]):
            continue
        blamed = decode if decode and not decode[0].startswith("spec.engine") else prefill
        assert blamed is not None  # they differ, so at least one pool sets the flag
        if flag == CONTEXT_LENGTH_FLAG:
            report.warnings.append(Problem(blamed[0], (
                f"{flag} differs between the pools (prefill: {_describe(prefill)}; decode: {_describe(decode)}): "
                "a prompt the prefill accepts may be too long for the decode; set it once in spec.engine.extraArgs")))
            continue
        report.errors.append(Problem(blamed[0], (
            f"Invalid value: {flag} must be equal on prefill and decode ({where}'s PD handshake refuses a "
            f"mismatch), but for prefill {_describe(prefill)} and for decode {_describe(decode)}; set it once in "
            "spec.engine.extraArgs, or to the same value in both pools")))
    return report


def check_router(spec: SpecServingSpec) -> Report:
    report = Report()
    chosen = router.implementation(spec)
    if spec.router.dp_aware and chosen not in router.DP_AWARE_WORKS:
        report.errors.append(Problem("spec.router.dpAware", (
            f"Invalid value: true: {chosen} (0.3.2) sends every request of a DP-aware PD router to "
            "http://0.0.0.<rank>/generate, so nothing is served; set spec.router.implementation: smg (which routes "
            "DP ranks) or leave dpAware unset")))
    if not router.implementation_known(spec):
        version = sglang_version(spec)
        image = f"the SGLang {version} image" if version else "this image"
        report.warnings.append(Problem("spec.router.implementation", (
            f"which router {image} carries is not recorded; rendering "
            f"{router.DEFAULT_IMPLEMENTATION} ({' '.join(router.LAUNCHERS[router.DEFAULT_IMPLEMENTATION])}). Set "
            "spec.router.implementation (sglang-router or smg), and spec.router.image if the serving image has "
            "no router")))
    return report


def check_parallelism(spec: SpecServingSpec) -> Report:
    """SGLang's start-up rules that decide GPUs and parallelism, for every version (read in server_args.py: 0.5.14
    asserts "Please enable dp attention when setting enable_dp_lm_head", and without DP attention dp > 1 runs dp
    copies of the model with tp GPUs each)."""
    report = Report()
    eng = spec.engine
    if not eng.enable_dp_attention and eng.dp > 1:
        report.errors.append(Problem("spec.engine.dp", (
            f"Invalid value: {eng.dp}: without enableDpAttention, dp {eng.dp} runs {eng.dp} copies of the model "
            f"with tp {eng.tp} GPUs each ({eng.dp * eng.tp} GPUs), but a replica gets {eng.tp}; set dp: 1, or "
            "enableDpAttention: true")))
    if eng.enable_dp_lm_head and not eng.enable_dp_attention and eng.dp > 1:
        report.errors.append(Problem("spec.engine.enableDpLmHead", (
            "Invalid value: true: SGLang refuses --enable-dp-lm-head without --enable-dp-attention; set "
            "enableDpLmHead: false, or enableDpAttention: true")))
    settings = {role: UserSettings(spec, role) for role in (PREFILL, DECODE)}
    for role in (PREFILL, DECODE):
        pipeline = settings[role].of(PP_SIZE_FLAG)
        if pipeline is not None and pipeline[1] != "1":
            report.errors.append(Problem(pipeline[0], (
                f'Invalid value: "{pipeline[1]}": {PP_SIZE_FLAG} {pipeline[1]} needs tp x pp = {eng.tp} x '
                f"{pipeline[1]} GPUs per replica, but a replica gets tp = {eng.tp} GPUs; remove it (pipeline "
                "parallelism is not supported) and size the replica with spec.engine.tp and nodesPerReplica")))
    spec_dec = spec.speculative
    if spec_dec.algorithm in EAGLE_FAMILY and spec_dec.num_steps is None \
            and settings[DECODE].of(ADAPTIVE_FLAG) is None:
        for path, value in (("spec.speculative.eagleTopk", spec_dec.eagle_topk),
                            ("spec.speculative.numDraftTokens", spec_dec.num_draft_tokens)):
            if value is not None:
                report.errors.append(Problem(path, (
                    f"Invalid value: {value}: SGLang chooses numSteps, eagleTopk and numDraftTokens together for "
                    f"{spec_dec.algorithm} and asserts that none is set when numSteps is not; set "
                    "spec.speculative.numSteps too, or remove this field")))
    if spec_dec.algorithm in EAGLE_FAMILY and spec_dec.num_steps is not None and spec_dec.eagle_topk is None \
            and settings[DECODE].of(ADAPTIVE_FLAG) is None:
        # Every release then compares speculative_eagle_topk (None) with 1 and stops with a TypeError.
        report.errors.append(Problem("spec.speculative.eagleTopk", (
            f"Required value: with numSteps set, SGLang needs eagleTopk for {spec_dec.algorithm} too (it stops "
            "at start-up without it); set eagleTopk (1 for a chain of drafts), or remove numSteps and "
            "numDraftTokens to let SGLang choose all three")))
    if eng.mem_fraction_static is not None and not 0 < float(eng.mem_fraction_static) < 1:
        report.errors.append(Problem("spec.engine.memFractionStatic", (
            f'Invalid value: "{eng.mem_fraction_static}": must lie between 0 and 1 (the rest of GPU memory holds '
            'activations and CUDA graphs); for example "0.85"')))
    return report


# Paths the renderer mounts itself.
RESERVED_MOUNTS = ("/dev/shm",)


def check_ports_and_paths(spec: SpecServingSpec) -> Report:
    """Collisions the schema cannot see: two listeners on one port, a model outside its volume."""
    report = Report()
    ports = {"spec.engine.port": spec.engine.port, "spec.prefill.bootstrapPort": spec.prefill.bootstrap_port}
    if max(spec.prefill.nodes_per_replica, spec.decode.nodes_per_replica) > 1:
        ports["the multi-node rendezvous port"] = DIST_INIT_PORT
    seen: dict[int, str] = {}
    for path, port in ports.items():
        if port in seen:
            report.errors.append(Problem(path, (
                f"Invalid value: {port}: {seen[port]} uses the same port in the same pod; choose another")))
        seen.setdefault(port, path)
    if spec.router.port == router.METRICS_PORT:
        report.errors.append(Problem("spec.router.port", (
            f"Invalid value: {spec.router.port}: the router serves its metrics on {router.METRICS_PORT}; choose "
            "another port")))
    vol = spec.model.volume
    for path, value in (("spec.model.path", spec.model.path),
                        ("spec.speculative.draftModelPath", spec.speculative.draft_model_path)):
        if value is None:
            continue
        if ".." in value.split("/"):
            report.errors.append(Problem(path, (
                f'Invalid value: "{value}": ".." is not allowed; give the path from the root')))
        elif vol is not None and (path == "spec.model.path" or value.startswith("/")):
            # A draft model given as a hub name ("org/draft") is fetched by SGLang; a path must be on the volume.
            mount, normal = posixpath.normpath(vol.mount_path), posixpath.normpath(value)
            if not (normal == mount or normal.startswith(mount if mount == "/" else mount + "/")):
                report.errors.append(Problem(path, (
                    f'Invalid value: "{value}": must lie below spec.model.volume.mountPath ({vol.mount_path}), the '
                    "only model volume the pods mount")))
    if vol is not None:
        mount = posixpath.normpath(vol.mount_path)
        for reserved in RESERVED_MOUNTS:
            if mount == reserved or mount.startswith(reserved + "/") or reserved.startswith(mount + "/") \
                    or mount == "/":
                report.errors.append(Problem("spec.model.volume.mountPath", (
                    f'Invalid value: "{vol.mount_path}": the operator mounts {reserved} itself; mount the model '
                    "elsewhere, for example /models")))
                break
    return report


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The Kubernetes quantity grammar (k8s.io/apimachinery resource.Quantity), as a pattern: a signed decimal number
# and an optional binary (Ki..Ei), decimal (n, u, m, k, M..E) or exponent (e3, E-2) suffix.
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
RESOURCE_KEYS = ("requests", "limits")


_QUANTITY_SUFFIXES: dict[str, Decimal] = {
    **{s: Decimal(2) ** (10 * i) for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12),
                                         ("P", 15), ("E", 18))}}


def quantity_value(text: str) -> Decimal:
    """The value of a Kubernetes quantity that matched QUANTITY (for comparing a request with its limit)."""
    match = re.fullmatch(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([eE][+-]?\d+|[a-zA-Z]*)", text)
    assert match is not None
    number, suffix = match.groups()
    if suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        return Decimal(number + suffix)
    return Decimal(number) * _QUANTITY_SUFFIXES[suffix]


def check_resources(spec: SpecServingSpec) -> Report:
    """resources objects are free-form in the schema (they are Kubernetes ResourceRequirements); make sure they
    are what the pods will take, so a bad one is refused here rather than breaking every reconcile pass."""
    report = Report()
    for path, resources in (("spec.prefill.resources", spec.prefill.resources),
                            ("spec.decode.resources", spec.decode.resources),
                            ("spec.router.resources", spec.router.resources)):
        if resources is None:
            continue
        for key, value in resources.items():
            if key not in RESOURCE_KEYS:
                report.errors.append(Problem(f"{path}.{key}", (
                    f'Unsupported value: "{key}": resources takes requests and limits')))
            elif not isinstance(value, dict):
                report.errors.append(Problem(f"{path}.{key}", (
                    f"Invalid value: {json.dumps(value)}: {key} must be a map of resource name to quantity, for "
                    'example {"memory": "64Gi"}')))
            else:
                for name, quantity in value.items():
                    if isinstance(quantity, bool) or not isinstance(quantity, (str, int, float)) \
                            or not QUANTITY.match(str(quantity)):
                        report.errors.append(Problem(f"{path}.{key}.{name}", (
                            f"Invalid value: {json.dumps(quantity)}: must be a Kubernetes quantity, for example "
                            '"8", "500m" or "64Gi"')))
        if not report.errors:
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            for name in sorted(set(requests) & set(limits)):
                if quantity_value(str(requests[name])) > quantity_value(str(limits[name])):
                    report.errors.append(Problem(f"{path}.requests.{name}", (
                        f'Invalid value: "{requests[name]}": must be less than or equal to the {name} limit '
                        f'("{limits[name]}"), or Kubernetes refuses the pods; raise the limit or lower the request')))
    return report


# Label syntax (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue).
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}")
LABEL_VALUE = re.compile(rf"(?:{_LABEL_NAME})?")


def check_node_selectors(spec: SpecServingSpec) -> Report:
    """nodeSelector entries are label selectors: Kubernetes refuses a pod whose key or value is not label syntax."""
    report = Report()
    for path, selector in (("spec.prefill.nodeSelector", spec.prefill.node_selector),
                           ("spec.decode.nodeSelector", spec.decode.node_selector),
                           ("spec.router.nodeSelector", spec.router.node_selector)):
        for key, value in (selector or {}).items():
            prefix = key.rpartition("/")[0]
            if not LABEL_KEY.fullmatch(key) or len(prefix) > 253:
                report.errors.append(Problem(f"{path}[{key}]", (
                    f'Invalid value: "{key}": a node label key is an optional DNS-subdomain prefix and "/", then '
                    "up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")))
            elif not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
                report.errors.append(Problem(f"{path}[{key}]", (
                    f"Invalid value: {json.dumps(value)}: a label value is empty or up to 63 letters, digits, '-', "
                    "'_' or '.', starting and ending with a letter or digit")))
    return report


# The image reference grammar (github.com/distribution/reference, grammar.go), written out: an optional registry
# host[:port], lower-case path components joined by "/" (separators ".", "_", "__" or dashes), then an optional
# ":tag" (up to 128 word characters, dots and dashes) and an optional "@algorithm:hex" digest.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"({_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
REPOSITORY = re.compile(_NAME)
NAME_MAX_LENGTH = 255


def check_image_references(spec: SpecServingSpec) -> Report:
    """Images the kubelet must pull and the repository the build pushes to, parsed by the reference grammar: a
    malformed one is refused here instead of leaving pods in InvalidImageName."""
    report = Report()
    for path, value, pattern, example in (
            ("spec.image.base", spec.image.base, IMAGE_REFERENCE, "lmsysorg/sglang:v0.5.23-cu129"),
            ("spec.router.image", spec.router.image, IMAGE_REFERENCE, "lmsysorg/sglang:v0.5.23-cu129"),
            ("spec.image.build.registry", spec.image.build.registry, REPOSITORY, "registry.example.com/sglang-pd")):
        if value is None:
            continue
        match = pattern.fullmatch(value)
        if match is None:
            hint = " (repository path components must be lower-case)" if value != value.lower() else ""
            report.errors.append(Problem(path, (
                f'Invalid value: "{value}": not a valid image reference{hint}; write it as '
                f"[registry/]repository[:tag][@digest], for example {example}")))
        elif len(match.group(1) if pattern is IMAGE_REFERENCE else value) > NAME_MAX_LENGTH:
            report.errors.append(Problem(path, (
                f'Invalid value: "{value}": the repository name is longer than {NAME_MAX_LENGTH} characters')))
    return report


def check_warnings(spec: SpecServingSpec) -> Report:
    report = Report()
    if spec.prefill.speculative_decoding == "Disabled":
        report.warnings.append(Problem("spec.prefill.speculativeDecoding", (
            f"prefill runs without speculative decoding while decode runs {spec.speculative.algorithm}; this "
            "works (the decode side builds its own draft state) but the prefill pool does not produce draft "
            "hidden states")))
    return report


def semantic_checks(spec: SpecServingSpec, table: CapabilityTable | None = None) -> Report:
    """The rules the CRD cannot express, on a spec that already passed the schema and CEL."""
    table = table or load()
    report = Report()
    for check in (check_pd_builder(spec, table), check_sglang_startup_rules(spec, table), check_env(spec),
                  check_command_lines(spec),
                  check_pd_symmetric(spec, table), check_router(spec), check_resources(spec),
                  check_parallelism(spec), check_ports_and_paths(spec), check_image_references(spec),
                  check_node_selectors(spec),
                  check_warnings(spec)):
        report.extend(check)
    return report


@dataclass
class Validation(Report):
    """validate's report, with the typed spec once the object was well-formed enough to parse: callers render and
    plan from it instead of parsing the object again."""

    spec: SpecServingSpec | None = None


def validate(obj: dict[str, Any], table: CapabilityTable | None = None, *, run_cel: bool = True,
             run_schema: bool = True, policy: ServingPolicy | None = None) -> Validation:
    """Everything wrong with the SpecServing object `obj`: schema, CEL rules, then the semantic rules, and what the
    cluster admin's serving-pod `policy` forbids (None: no policy, as offline).

    `run_cel=False` skips the CEL rules, for callers behind an apiserver that has already applied them.
    `run_schema=False` skips the structural schema too, for the one caller that sees an object the moment the
    apiserver has checked it against the installed CRD: the admission webhook. A stored object read later may
    predate a stricter schema (the apiserver does not re-check what it stored), so the reconciler keeps the check.
    """
    report = Validation()
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        report.errors.append(Problem("kind", (
            f"expected apiVersion {API_VERSION} and kind {KIND}, got {obj.get('apiVersion')!r} and "
            f"{obj.get('kind')!r}")))
        report.malformed = report.not_a_specserving = True
        return report
    if not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("name"):
        report.errors.append(Problem("metadata.name", "Required value: give the SpecServing a name"))
        report.malformed = report.not_a_specserving = True
        return report
    if not DNS_1035.match(str(obj["metadata"]["name"])):
        report.errors.append(Problem("metadata.name", (
            f'Invalid value: "{obj["metadata"]["name"]}": must be a DNS-1035 label (lower-case letters, digits and '
            "'-', starting with a letter): the children's Services are named after it")))
    full = structural.whole_numbers(defaulted(obj), schema())
    if run_schema:
        report.errors += structural.check(full, schema())
    if report.errors:
        report.malformed = True
        return report  # CEL and semantics assume the shape is right
    if run_cel:
        # Imported here: the operator and the webhook never run CEL (the API server did), and celpy with its lark
        # grammar took the operator's imports from 72 to 78 MiB RSS, kept for nothing.
        from specserving.api import cel

        report.errors += cel.check(full, schema())
    report.spec = from_dict(SpecServingSpec, full.get("spec", {}))  # already defaulted: parsed, not defaulted again
    report.extend(semantic_checks(report.spec, table))
    if policy is not None:
        report.extend(check_policy(report.spec, str(obj["metadata"].get("namespace") or "default"), policy))
    return report
