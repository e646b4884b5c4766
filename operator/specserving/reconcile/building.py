"""The image of an admitted plan: the base as-is, a build in progress, or the built digest; and the build Job,
created once and shared by every SpecServing of a namespace that builds the same base."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from specserving.imagebuild.job import build_objects, owned_by
from specserving.imagebuild.planning import BUILD
from specserving.kube import ApiError, Kube
from specserving.metrics import Metrics
from specserving.reconcile import conditions as C
from specserving.reconcile import reasons as R
from specserving.reconcile.errors import Blocked
from specserving.reconcile.events import post
from specserving.reconcile.image import BuildConfig, ImageVerdict, remembered, resolve
from specserving.reconcile.plan import Plan
from specserving.reconcile.state import Key
from specserving.reconcile.watched import Watched

log = logging.getLogger("specserving.reconcile")

# A Job this process created is not yet in the watch's index: for this long, do not create it again.
BUILD_SETTLE_SECONDS = 30.0


class Builds:
    """Resolves images and starts build Jobs."""

    def __init__(self, kube: Kube, config: BuildConfig, metrics: Metrics, watched: Watched) -> None:
        self.kube, self.config, self.metrics, self.watched = kube, config, metrics, watched
        # Build Jobs this process created, (namespace, name) -> monotonic time, until the watch shows them.
        self.started: dict[Key, float] = {}

    def job_deleted(self, namespace: str, name: str) -> None:
        self.started.pop((namespace, name), None)

    async def image(self, key: Key, body: dict[str, Any], plan: Plan, old_status: Mapping[str, Any] | None,
                    ) -> ImageVerdict:
        """Resolve the image of an admitted plan; create the build Job when one is needed and none exists."""
        ip = plan.image_plan
        assert ip is not None
        namespace = key[0]
        if ip.decision != BUILD or not ip.build_key or not ip.build_name:
            return resolve(ip, self.config.table)
        others: Iterable[Mapping[str, Any] | None] = (
            b.get("status") for k in self.watched.known() if k[0] == namespace and k != key
            if (b := self.watched.owner(k)) is not None)
        verdict = resolve(ip, self.config.table, remembered_ref=remembered([old_status, *others], ip),
                          job=self.watched.build_job(namespace, ip.build_key),
                          pods=self.watched.build_pods(namespace, ip.build_key))
        if not verdict.start_build:
            return verdict
        since = self.started.get((namespace, ip.build_name))
        if since is not None and time.monotonic() - since < BUILD_SETTLE_SECONDS:
            return verdict  # created by this process a moment ago; the watch has not shown it yet
        try:
            await self._start(namespace, body, plan)
        except ApiError as exc:
            if exc.status in (0, 409, 429) or exc.status >= 500:
                raise
            await post(self.kube, body, R.CHILD_APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}")
            return ImageVerdict(C.FALSE, R.APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}; "
                                "no pool is started", status_image=verdict.status_image)
        return verdict

    async def _start(self, namespace: str, body: dict[str, Any], plan: Plan) -> None:
        """Create the shared build Job, then its context ConfigMap owned by the Job (the Job's TTL takes both).
        Neither is owned by a SpecServing: every SpecServing on the same base waits on the same Job."""
        ip, spec = plan.image_plan, plan.spec
        assert ip is not None and spec is not None and ip.build_name
        if self.config.context is None:
            raise Blocked(R.BUILD_FAILED, "the operator was started without a build context", retry=None)
        ref = spec.image.build.push_secret_ref
        config_map, job = build_objects(ip, self.config.context, namespace=namespace,
                                        push_secret=ref.name if ref else self.config.push_secret,
                                        settings=self.config.settings)
        jobs = await asyncio.to_thread(self.kube.resource, "batch/v1", "Job")
        config_maps = await asyncio.to_thread(self.kube.resource, "v1", "ConfigMap")
        assert jobs is not None and config_maps is not None  # built-in kinds
        created = await asyncio.to_thread(self.kube.apply, jobs, job)
        await asyncio.to_thread(self.kube.apply, config_maps, owned_by(config_map, created))
        self.started[(namespace, ip.build_name)] = time.monotonic()
        self.metrics.child_applies.labels("Job", "changed").inc()
        log.info("%s/%s: started build Job %s: %s -> %s", namespace, body["metadata"]["name"], ip.build_name,
                 ip.base, ip.target)
        await post(self.kube, body, R.BUILD_STARTED, f"created build Job {ip.build_name}: {ip.base} -> "
                   f"{ip.target} (the probe requires a PD-decode builder for {ip.algorithm})")
