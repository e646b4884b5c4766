"""The image of an admitted plan: the base as-is, a build in progress, or the built digest; and the build Job,
created once and shared by every SpecServing of a namespace that builds the same base."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from specserving.api.types import SpecServingSpec
from specserving.imagebuild.job import build_objects, owned_by
from specserving.imagebuild.planning import BUILD, DIGEST, ImagePlan
from specserving.registry import RegistryError, credentials_from_dockerconfig
from specserving.kube import ApiError, Kube
from specserving.metrics import Metrics
from specserving.reconcile.calls import call
from specserving.reconcile import conditions as C
from specserving.reconcile import reasons as R
from specserving.reconcile.errors import Blocked
from specserving.reconcile.events import post
from specserving.reconcile.image import REQUIRED, BuildConfig, ImageVerdict, build_job_of, remembered, resolve
from specserving.reconcile.plan import Plan
from specserving.reconcile.state import Key
from specserving.reconcile.watched import Watched

log = logging.getLogger("specserving.reconcile")

# A Job this process created is not yet in the watch's index: for this long, do not create it again.
BUILD_SETTLE_SECONDS = 30.0
# A base's digest (or the registry's refusal) is reused for this long, across SpecServings and passes.
BASE_CACHE_SECONDS = 10.0
BASE_RETRY_SECONDS = 60.0


class Builds:
    """Resolves images and starts build Jobs."""

    def __init__(self, kube: Kube, config: BuildConfig, metrics: Metrics, watched: Watched) -> None:
        self.kube, self.config, self.metrics, self.watched = kube, config, metrics, watched
        # Build Jobs this process created, (namespace, name) -> monotonic time, until the watch shows them.
        self.started: dict[Key, float] = {}
        # The image plan of each SpecServing's last pass, its base pinned to a digest: the build it waits on.
        self.current: dict[Key, ImagePlan] = {}
        # (namespace, base, pull secrets) -> (monotonic time, digest or the registry's refusal).
        self.bases: dict[tuple[str, str, tuple[str, ...]], tuple[float, str | RegistryError]] = {}
        # The uids of build Jobs whose end was counted.
        self.finished: set[str] = set()
        self.began = time.time()

    def job_deleted(self, namespace: str, name: str) -> None:
        self.started.pop((namespace, name), None)

    def forget(self, key: Key) -> None:
        self.current.pop(key, None)

    def waits_on(self, key: Key, namespace: str, build_key: str) -> bool:
        ip = self.current.get(key)
        return key[0] == namespace and ip is not None and ip.build_key == build_key

    def job_seen(self, body: Mapping[str, Any]) -> None:
        """Count a build Job's end once (metrics): succeeded or failed, and how long it ran. Jobs that ended before
        this process started were counted by the process that saw them end."""
        job = build_job_of(body)
        if not (job.succeeded or job.failed) or job.uid in self.finished:
            return
        status = body.get("status") or {}
        outcome = "failed" if job.failed else "succeeded"
        self.finished.add(job.uid)
        start, end = _seconds(status.get("startTime")), _seconds(
            status.get("completionTime") or _condition_time(status, "Failed" if job.failed else "Complete"))
        if end is not None and end < self.began - 60:
            return
        self.metrics.builds.labels(outcome).inc()
        if start is not None and end is not None and end >= start:
            self.metrics.build_seconds.labels(outcome).observe(end - start)

    async def image(self, key: Key, body: dict[str, Any], plan: Plan, old_status: Mapping[str, Any] | None,
                    ) -> ImageVerdict:
        """Resolve the image of an admitted plan; create the build Job when one is needed and none exists."""
        ip = plan.image_plan
        assert ip is not None and plan.spec is not None
        namespace = key[0]
        if ip.decision == BUILD and ip.registry:
            try:
                ip = await self._pin(key, body, plan.spec, ip, old_status)
            except RegistryError as exc:  # --base-digests=Required: no build until the base resolves
                self.current.pop(key, None)
                status_image = {k: v for k, v in (resolve(ip, self.config.table).status_image or {}).items()
                                if k not in ("buildKey", "tag")}
                return ImageVerdict(C.FALSE, R.BASE_UNRESOLVED,
                                    f"cannot resolve {ip.base} to a digest: {exc}; no build starts until it resolves "
                                    f"(--base-digests=Required; retried every {BASE_RETRY_SECONDS:.0f}s)",
                                    status_image=status_image)
        self.current[key] = ip
        if ip.decision != BUILD or not ip.build_key or not ip.build_name:
            return resolve(ip, self.config.table)
        others = ({"image": image} for image in self.watched.images_in(namespace, but=key))
        verdict = resolve(ip, self.config.table, remembered_ref=remembered([old_status, *others], ip),
                          job=self.watched.build_job(namespace, ip.build_key),
                          pods=self.watched.build_pods(namespace, ip.build_key))
        if not verdict.start_build:
            return verdict
        since = self.started.get((namespace, ip.build_name))
        if since is not None and time.monotonic() - since < BUILD_SETTLE_SECONDS:
            return verdict  # created by this process a moment ago; the watch has not shown it yet
        try:
            await self._start(namespace, body, plan, ip)
        except ApiError as exc:
            if exc.status in (0, 409, 429) or exc.status >= 500:
                raise
            post(self.kube, body, R.CHILD_APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}")
            return ImageVerdict(C.FALSE, R.APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}; "
                                "no pool is started", status_image=verdict.status_image)
        return verdict

    async def _pin(self, key: Key, body: dict[str, Any], spec: SpecServingSpec, ip: ImagePlan,
                   old_status: Mapping[str, Any] | None) -> ImagePlan:
        """The plan with its base pinned to the digest its tag points to, so builds are keyed by content.

        Resolved once per base: the first pass records the outcome in status.image (baseDigest, or a build key by
        tag when the registry could not say), and later passes reuse it, so a tag that moves under a running
        SpecServing never rebuilds and rolls it by surprise. A new SpecServing, or a new spec.image.base, resolves
        again."""
        if ip.base_digest or self.config.resolver is None:
            return ip
        image = (old_status or {}).get("image") or {}
        if image.get("base") == ip.base:
            recorded = image.get("baseDigest")
            if isinstance(recorded, str) and DIGEST.fullmatch(recorded):
                return ip.pinned(recorded)
            if image.get("buildKey") == ip.build_key:
                return ip  # keyed by the tag on an earlier pass (unresolvable then, or before base digests)
        secrets = tuple(ref.name for ref in spec.image.pull_secrets or ())
        try:
            digest = await self._resolve(key[0], ip.base, secrets)
        except RegistryError as exc:
            if self.config.base_digests == REQUIRED:
                raise
            post(self.kube, body, R.BASE_UNRESOLVED,
                       f"cannot resolve {ip.base} to a digest ({exc}); the build is keyed by the tag instead, so a "
                       "tag that moves later is not rebuilt: pin spec.image.base to a digest to be sure", warning=True)
            return ip
        return ip.pinned(digest)

    async def _resolve(self, namespace: str, base: str, secrets: tuple[str, ...]) -> str:
        resolver = self.config.resolver
        assert resolver is not None
        cache_key = (namespace, base, secrets)
        hit = self.bases.get(cache_key)
        if hit is not None and time.monotonic() - hit[0] < BASE_CACHE_SECONDS:
            if isinstance(hit[1], RegistryError):
                raise hit[1]
            return hit[1]
        credentials = credentials_from_dockerconfig(await self._pull_secrets(namespace, secrets))
        try:
            digest = await asyncio.to_thread(resolver.digest, base, credentials)
        except RegistryError as exc:
            self.bases[cache_key] = (time.monotonic(), exc)
            raise
        self.bases[cache_key] = (time.monotonic(), digest)
        log.info("%s: %s resolves to %s", namespace, base, digest)
        return digest

    async def _pull_secrets(self, namespace: str, names: tuple[str, ...]) -> list[bytes]:
        """The dockerconfigjson documents of the named pull secrets that exist and can be read; the others are
        skipped (the registry's refusal then says credentials are missing)."""
        if not names or not self.config.read_pull_secrets:
            return []
        secrets = await call(self.kube.resource, "v1", "Secret")
        assert secrets is not None
        out = []
        for name in names:
            try:
                secret = await call(self.kube.get, secrets, namespace, name)
            except ApiError as exc:
                log.warning("%s: cannot read pull secret %s to resolve the base image: %s", namespace, name, exc)
                continue
            data = (secret.get("data") or {}).get(".dockerconfigjson")
            if data:
                out.append(base64.b64decode(data))
        return out

    async def _start(self, namespace: str, body: dict[str, Any], plan: Plan, ip: ImagePlan) -> None:
        """Create the shared build Job, then its context ConfigMap owned by the Job (the Job's TTL takes both).
        Neither is owned by a SpecServing: every SpecServing on the same base waits on the same Job."""
        spec = plan.spec
        assert spec is not None and ip.build_name
        if self.config.context is None:
            raise Blocked(R.BUILD_FAILED, "the operator was started without a build context", retry=None)
        ref = spec.image.build.push_secret_ref
        config_map, job = build_objects(ip, self.config.context, namespace=namespace,
                                        push_secret=ref.name if ref else self.config.push_secret,
                                        settings=self.config.settings)
        jobs = await call(self.kube.resource, "batch/v1", "Job")
        config_maps = await call(self.kube.resource, "v1", "ConfigMap")
        assert jobs is not None and config_maps is not None  # built-in kinds
        created = await call(self.kube.apply, jobs, job)
        await call(self.kube.apply, config_maps, owned_by(config_map, created))
        self.started[(namespace, ip.build_name)] = time.monotonic()
        self.metrics.child_applies.labels("Job", "changed").inc()
        self.metrics.builds.labels("started").inc()
        log.info("%s/%s: started build Job %s: %s -> %s", namespace, body["metadata"]["name"], ip.build_name,
                 ip.base_ref, ip.target)
        post(self.kube, body, R.BUILD_STARTED, f"created build Job {ip.build_name}: {ip.base_ref} -> "
                   f"{ip.target} (the probe requires a PD-decode builder for {ip.algorithm})")


def _seconds(stamp: Any) -> float | None:
    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _condition_time(status: Mapping[str, Any], kind: str) -> Any:
    return next((c.get("lastTransitionTime") for c in status.get("conditions") or []
                 if c.get("type") == kind and c.get("status") == "True"), None)
