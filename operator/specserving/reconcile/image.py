"""The serving image of one generation: the base image, a build in progress, or the built image by digest.

Pure. `resolve` reads the image plan (imagebuild.planning), what the SpecServing's status remembers, and what the
watches saw of the shared build Job and its pod, and says what the ImageReady condition shows, which image the
pools run (None: no pool is rendered), what status.image records and whether the build Job must be created.
The controller does the one write this can call for (creating the Job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specserving.capabilities import UNKNOWN_VERSION, CapabilityTable, Verdict
from specserving.capabilities import load as load_capabilities
from specserving.imagebuild.context import BuildContext
from specserving.imagebuild.job import BUILD_LABEL, BuildSettings, digest_from_message
from specserving.imagebuild.planning import BUILD, CANNOT_SERVE, IMAGE_NAME, NOT_NEEDED, ImagePlan
from specserving.registry import Resolver
from specserving.reconcile import reasons as R
from specserving.reconcile.conditions import FALSE, TRUE
from specserving.rendering.image import ResolvedImage

# --base-digests: resolve the base's tag to a digest before a build, and what to do when the registry cannot say.
REQUIRED, BEST_EFFORT, OFF = "Required", "BestEffort", "Off"
BASE_DIGEST_MODES = (REQUIRED, BEST_EFFORT, OFF)

# How much of a failed build's log (its termination message) goes into the condition.
LOG_TAIL_BYTES = 2000
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


@dataclass(frozen=True, slots=True)
class BuildConfig:
    """Operator-wide build settings, fixed at start-up: the context (and so the fix's version), the defaults a
    SpecServing's spec.image.build may override, and the capability table."""

    context: BuildContext | None = None
    registry: str | None = None
    push_secret: str | None = None
    settings: BuildSettings = BuildSettings()
    table: CapabilityTable = field(default_factory=load_capabilities)
    # Reads a base tag's digest from its registry (None: builds are keyed by the tag as written), and what an
    # unresolvable base does: Required blocks the build, BestEffort keys it by the tag with a warning.
    resolver: Resolver | None = None
    base_digests: str = BEST_EFFORT
    # Read spec.image.pullSecrets for those lookups (the chart grants get on Secrets only when asked to).
    read_pull_secrets: bool = False

    @property
    def fix_version(self) -> str:
        return self.context.fix_version if self.context else ""


# -- what the watches saw ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BuildJob:
    """A build Job, boiled down."""

    name: str
    uid: str
    build_key: str
    succeeded: bool = False
    failed: bool = False
    # The Failed condition's reason and message (BackoffLimitExceeded, DeadlineExceeded, ...).
    failure: str = ""


def build_job_of(body: Mapping[str, Any]) -> BuildJob:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = conds.get("Failed")
    failure = ""
    if failed:
        failure = ": ".join(p for p in (failed.get("reason"), failed.get("message")) if p)
    return BuildJob(
        name=meta.get("name", ""), uid=meta.get("uid", ""), build_key=(meta.get("labels") or {}).get(BUILD_LABEL, ""),
        succeeded="Complete" in conds or (int(status.get("succeeded") or 0) > 0 and not failed),
        failed=failed is not None, failure=failure)


@dataclass(frozen=True, slots=True)
class BuildPod:
    """A build Job's pod, boiled down to what the build's outcome and progress need."""

    name: str
    job_uid: str
    phase: str
    created: str = ""
    exit_code: int | None = None
    # The container's termination message: the digest on success, the log's tail on failure.
    message: str = ""
    # Why it is not running yet (ErrImagePull, ...), or why it ended (Error, OOMKilled, DeadlineExceeded).
    reason: str = ""
    detail: str = ""


def build_pod_of(body: Mapping[str, Any]) -> BuildPod:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    labels = meta.get("labels") or {}
    pod = BuildPod(name=meta.get("name", ""), job_uid=next((labels[k] for k in JOB_UID_LABELS if k in labels), ""),
                   phase=status.get("phase") or "Pending", created=meta.get("creationTimestamp") or "",
                   reason=status.get("reason") or "", detail=status.get("message") or "")
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("terminated"):
            t = state["terminated"]
            return BuildPod(pod.name, pod.job_uid, pod.phase, pod.created, exit_code=int(t.get("exitCode", 0)),
                            message=(t.get("message") or "").strip(), reason=t.get("reason") or "")
        if state.get("waiting", {}).get("reason"):
            w = state["waiting"]
            return BuildPod(pod.name, pod.job_uid, pod.phase, pod.created, reason=w["reason"],
                            detail=w.get("message") or "")
    return pod


# -- the verdict -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ImageVerdict:
    """The ImageReady condition, the image the pools run, and status.image."""

    status: str
    reason: str
    message: str
    # What the pools run; None while building, after a failure, or when nothing can be built: no pool is rendered.
    image: ResolvedImage | None = None
    status_image: dict[str, Any] | None = None
    # The build Job does not exist (and no digest is remembered): create it.
    start_build: bool = False

    @property
    def ready(self) -> bool:
        return self.status == TRUE

    @property
    def failed(self) -> bool:
        """A verdict that waiting cannot change (only a new spec, a new Job or a configured registry can)."""
        return self.status == FALSE and self.reason != R.BUILDING


def tail(text: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a build log, at most `limit` bytes, marked when cut."""
    data = text.strip().encode()
    if len(data) <= limit:
        return text.strip()
    return "..." + data[-limit:].decode(errors="ignore")


def built_ref(registry: str, digest: str) -> str:
    return f"{registry}/{IMAGE_NAME}@{digest}"


def pd_builders(verdict: Verdict) -> list[str]:
    """The algorithms with a PD-decode builder in the image: the table's, or (for a version it lacks, where the
    build probe checked the one algorithm) that algorithm."""
    if verdict.kind != UNKNOWN_VERSION:
        return sorted(verdict.builders)
    return [verdict.algorithm] if verdict.with_fix else []


def _image_status(ip: ImagePlan, table: CapabilityTable, resolved: str | None, fix_applied: bool | None,
                  ) -> dict[str, Any]:
    out: dict[str, Any] = {"base": ip.base}
    if resolved:
        out["resolved"] = resolved
    if fix_applied is not None:
        out["fixApplied"] = fix_applied
    if ip.sglang_version:
        out["sglangVersion"] = ip.sglang_version
    if resolved and fix_applied is not None:
        verdict = table.verdict(ip.sglang_version, ip.algorithm, with_fix=fix_applied)
        builders = pd_builders(verdict)
        if builders or verdict.kind != UNKNOWN_VERSION:
            out["pdBuilders"] = builders
    if ip.decision == BUILD and ip.build_key and ip.target:
        out["buildKey"] = ip.build_key
        out["tag"] = ip.target
        if ip.base_digest:
            out["baseDigest"] = ip.base_digest
    return out


def remembered(statuses: Iterable[Mapping[str, Any] | None], ip: ImagePlan) -> str | None:
    """A digest reference for this build that a status.image already records (this SpecServing's first, then its
    namespace's), so a build whose Job the TTL removed is not run again."""
    if ip.decision != BUILD or not ip.registry or not ip.build_key:
        return None
    head = built_ref(ip.registry, "")
    for status in statuses:
        image = (status or {}).get("image") or {}
        ref = str(image.get("resolved") or "")
        if image.get("buildKey") == ip.build_key and ref.startswith(head) and digest_from_message(ref[len(head):]):
            return ref
    return None


def _newest(pods: Iterable[BuildPod], job: BuildJob) -> BuildPod | None:
    mine = [p for p in pods if not p.job_uid or p.job_uid == job.uid]
    return max(mine, key=lambda p: (p.created, p.name)) if mine else None


def _progress(pod: BuildPod | None) -> str:
    if pod is None:
        # The Job controller reports why it cannot create the pod (Pod Security, quota) only in events.
        return "its pod is not created yet; if that lasts, `kubectl describe job` shows why (a FailedCreate event)"
    if pod.reason and pod.phase == "Pending":
        return f"pod {pod.name} is Pending: {pod.reason}" + (f": {pod.detail}" if pod.detail else "")
    return f"pod {pod.name} is {pod.phase}"


def resolve(ip: ImagePlan, table: CapabilityTable, *, remembered_ref: str | None = None, job: BuildJob | None = None,
            pods: Iterable[BuildPod] = ()) -> ImageVerdict:
    """What the pools of a generation whose image plan is `ip` run now."""
    if ip.decision == NOT_NEEDED:
        base = ResolvedImage(ref=ip.base, sglang_version=ip.sglang_version)
        return ImageVerdict(TRUE, R.NOT_NEEDED, f"{ip.reason}; the pools run {ip.base}", image=base,
                            status_image=_image_status(ip, table, ip.base, False))
    if ip.decision == CANNOT_SERVE:
        return ImageVerdict(FALSE, R.IMAGE_LACKS_BUILDER, f"{ip.reason}; no pool is started",
                            status_image=_image_status(ip, table, None, None))
    assert ip.decision == BUILD
    if not ip.registry or not ip.target:
        return ImageVerdict(
            FALSE, R.REGISTRY_MISSING,
            f"{ip.reason}, but no registry to push it to is configured: set spec.image.build.registry, or start "
            "the operator with --build-registry (Helm value build.registry); no pool is started",
            status_image=_image_status(ip, table, None, None))
    if remembered_ref:
        return _built(ip, table, remembered_ref)
    if job is None:
        return ImageVerdict(FALSE, R.BUILDING, f"{ip.reason}: starting the build of {ip.target} from {ip.base_ref} "
                            f"(Job {ip.build_name}); no pool is started until it is pushed",
                            status_image=_image_status(ip, table, None, None), start_build=True)
    pod = _newest(pods, job)
    if job.failed or (pod is not None and pod.exit_code not in (None, 0)):
        if pod is not None and pod.message:
            why = f"{pod.reason or 'Error'} (exit code {pod.exit_code}): {tail(pod.message)}"
        elif pod is not None and pod.exit_code is not None:
            why = f"{pod.reason or 'Error'} (exit code {pod.exit_code}), no log"
        else:
            why = job.failure or "the Job failed"
        return ImageVerdict(FALSE, R.BUILD_FAILED,
                            f"the build of {ip.target} from {ip.base} failed in Job {job.name}: {why}; delete the "
                            "Job to build again; no pool is started", status_image=_image_status(ip, table, None, None))
    if job.succeeded or (pod is not None and pod.exit_code == 0):
        if pod is None or pod.exit_code is None:
            return ImageVerdict(FALSE, R.BUILDING, f"the build Job {job.name} finished; reading the digest from "
                                "its pod", status_image=_image_status(ip, table, None, None))
        digest = digest_from_message(pod.message)
        if digest is None:
            return ImageVerdict(FALSE, R.BUILD_FAILED,
                                f"the build Job {job.name} succeeded but its pod {pod.name} wrote no image digest "
                                f"to its termination message (got {tail(pod.message, 200)!r}); delete the Job to build "
                                "again; no pool is started", status_image=_image_status(ip, table, None, None))
        return _built(ip, table, built_ref(ip.registry, digest))
    return ImageVerdict(FALSE, R.BUILDING, f"{ip.reason}: building {ip.target} from {ip.base_ref} in Job {job.name} "
                        f"({_progress(pod)}); no pool is started until it is pushed",
                        status_image=_image_status(ip, table, None, None))


def _built(ip: ImagePlan, table: CapabilityTable, ref: str) -> ImageVerdict:
    """The same verdict whether the digest came from the Job's pod or from status.image, so nothing is rewritten
    when the Job goes."""
    image = ResolvedImage(ref=ref, sglang_version=ip.sglang_version, fix_applied=True)
    return ImageVerdict(TRUE, R.BUILT, f"built {ip.target} from {ip.base}; the pools run {ref}", image=image,
                        status_image=_image_status(ip, table, ref, True))
