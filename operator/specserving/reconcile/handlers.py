"""The kopf handlers: thin wrappers that feed the controller and translate its verdicts into kopf's errors.

- SpecServing create/update/resume -> Controller.reconcile (one function). InvalidSpec is a PermanentError
  (nothing a retry can fix), a missing CRD a TemporaryError (install it and the next retry proceeds).
- Every child kind and pool pods, selected by the specserving.io/instance label: our own informers
  (reconcile/informer.py), not kopf's watches; each keeps a summary per object (in memory, so status and drift checks
  never ask the API) and pokes the owner on each change.
- Build Jobs and their pods, selected by the specserving.io/build label: a kopf index keyed by (namespace, build
  key) and an event handler that pokes every SpecServing waiting on that build.
- kopf's own bookkeeping goes to annotations under operator.specserving.io/, never into .status.
- No deletion handler and no daemon or timer, so kopf adds no finalizer: owner references let the garbage
  collector remove the children (docs/operator.md explains why that is enough).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import kopf

from specserving import GROUP, KIND, PLURAL, VERSION
from specserving.imagebuild.job import BUILD_LABEL
from specserving.kube import ApiError
from specserving.reconcile import events, memory
from specserving.reconcile.controller import Controller
from specserving.reconcile.errors import Blocked, Rejected
from specserving.reconcile.image import build_job_of, build_pod_of
from specserving.reconcile.informer import Informers, Source
from specserving.rendering.kinds import CHILD_KINDS, ChildKind
from specserving.reconcile.observed import child_of, pod_of
from specserving.reconcile.watched import (BUILD_JOB_INDEX, BUILD_POD_INDEX, KOPF_PREFIX, OWNER_INDEX,
                                          POD_INDEX, StoredOwner, child_index)
from specserving.rendering import labels as L

PREFIX = KOPF_PREFIX
BUILDS = {BUILD_LABEL: kopf.PRESENT}
# Pool pods: the API server filters by both labels (an existence test for the instance label).
POOL_PODS = f"app.kubernetes.io/managed-by={L.FIELD_MANAGER},{L.INSTANCE}"
TRANSIENT_RETRY_SECONDS = 5.0
WATCH_WORKER_IDLE_SECONDS = 0.5
EVENTS_FLUSH_SECONDS = 5.0  # at stop, within the 30 s a Pod's termination grace gives the operator
log = logging.getLogger("specserving.handlers")


class OwnerOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, kept for SpecServings only.

    On every watch event of every watched kind, kopf builds the object's "essence" for its change detection: a deep
    copy of the whole body, managedFields and status included, most of which it then drops. Only SpecServings have
    create/update handlers that use it; children, pods and Jobs feed indexes and event handlers, which never look
    at it, so theirs is empty. The copies were a third of kopf's per-event time with 100 SpecServings (bench/).
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") != KIND:
            return kopf.BodyEssence()
        if not extra_fields:
            # kopf deep-copies what it is given and then drops the status and all of the metadata but labels and
            # annotations: given only those, it copies a fifth of a SpecServing (the same essence; the copy of the
            # whole body was 2% of the operator's CPU in issue 21's N=200 profile).
            meta = body.get("metadata") or {}
            body = kopf.Body(cast(kopf.RawBody, {
                **{k: v for k, v in body.items() if k not in ("status", "metadata")},
                "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}}))
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if body.get("kind") != KIND:
            return None
        return super().fetch(body=body)


def build_registry(controller: Controller, *, resync_seconds: float = 600.0,
                   namespaces: list[str] | None = None) -> kopf.OperatorRegistry:
    """A fresh kopf registry with every handler bound to `controller`; `namespaces` empty or None: all of them."""
    reg = kopf.OperatorRegistry()
    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(id="configure", registry=reg)
    async def configure(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = OwnerOnlyDiffBase(prefix=PREFIX, key="last-handled-configuration")
        settings.persistence.finalizer = f"{PREFIX}/finalizer"
        settings.posting.enabled = False  # the controller posts its own events, with CamelCase reasons
        # kopf keeps an object's last raw watch event (managedFields and all) while its worker waits for the next
        # one: 5 s by default, which in a burst is nearly every child and pod at once (issue 21's heap profile).
        settings.queueing.idle_timeout = WATCH_WORKER_IDLE_SECONDS
        # kopf watches only build pods and build Jobs besides SpecServings: the filter runs in the API server.
        settings.watching.label_selectors["", "v1", "pods"] = BUILD_LABEL
        settings.watching.label_selectors["batch", "v1", "jobs"] = BUILD_LABEL
        controller.informers = informers = informers_for(controller, namespaces or [])
        controller.indices = {**{k: v for k, v in kwargs.items() if isinstance(v, kopf.Index)},
                              POD_INDEX: informers.view("pods"),
                              **{child_index(kind): informers.view(kind.plural) for kind in CHILD_KINDS}}
        log.debug("indexes: %s", ", ".join(sorted(controller.indices)))
        informers.start()
        if resync_seconds > 0:
            tasks.append(asyncio.get_running_loop().create_task(_resync(controller, resync_seconds)))
        tasks.append(asyncio.get_running_loop().create_task(memory.trim_every()))

    @kopf.on.cleanup(id="stop", registry=reg)
    async def stop(**_: Any) -> None:
        # What a pass said happened should reach `kubectl describe` even when the operator stops right after it.
        await events.flush(timeout=EVENTS_FLUSH_SECONDS)
        if controller.informers is not None:
            controller.informers.stop()
        for task in tasks:
            task.cancel()

    @kopf.on.login(id="login", registry=reg)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(**controller.kube.connection())

    @kopf.on.probe(id="specservings_watched", registry=reg)
    def probe(**_: Any) -> int:
        return len(controller.known())

    @kopf.index(GROUP, VERSION, PLURAL, id=OWNER_INDEX, registry=reg)
    async def index_owner(*, namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(namespace or "", name): StoredOwner.of(body)}

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=reg)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=reg)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", registry=reg)
    async def reconcile(*, namespace: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        try:
            await controller.reconcile((namespace or "", name), body)
        except Rejected as exc:
            raise kopf.PermanentError(f"InvalidSpec: {exc}") from None
        except Blocked as exc:
            if exc.retry:
                raise kopf.TemporaryError(str(exc), delay=exc.retry) from None
            raise kopf.PermanentError(str(exc)) from None
        except ApiError as exc:
            if not exc.transient:
                raise  # unexpected: kopf logs it with its traceback and retries
            # The API server went away or pushed back mid-pass: one line in the log, and kopf retries the handler.
            raise kopf.TemporaryError(str(exc), delay=TRANSIENT_RETRY_SECONDS) from None

    @kopf.on.event(GROUP, VERSION, PLURAL, id="specservings", registry=reg)
    async def owner_event(*, type: str, namespace: str | None, name: str, **_: Any) -> None:  # noqa: A002
        if type == "DELETED":
            controller.forget((namespace or "", name))

    @kopf.index("batch", "v1", "jobs", id=BUILD_JOB_INDEX, labels=BUILDS, registry=reg)
    async def index_build_job(*, namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                              **_: Any) -> dict[Any, Any]:
        return {(namespace or "", labels[BUILD_LABEL]): build_job_of(dict(body))}

    @kopf.on.event("batch", "v1", "jobs", id="build-jobs", labels=BUILDS, registry=reg)
    async def build_job_event(*, type: str, namespace: str | None, name: str, labels: kopf.Labels,  # noqa: A002
                              body: kopf.Body, **_: Any) -> None:
        if type != "DELETED":
            controller.builds.job_seen(dict(body))
        controller.build_event(namespace or "", labels[BUILD_LABEL], name, deleted=type == "DELETED")

    @kopf.index("", "v1", "pods", id=BUILD_POD_INDEX, labels=BUILDS, registry=reg)
    async def index_build_pod(*, namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                              **_: Any) -> dict[Any, Any]:
        return {(namespace or "", labels[BUILD_LABEL]): build_pod_of(dict(body))}

    @kopf.on.event("", "v1", "pods", id="build-pods", labels=BUILDS, registry=reg)
    async def build_pod_event(*, namespace: str | None, name: str, labels: kopf.Labels, **_: Any) -> None:
        controller.build_event(namespace or "", labels[BUILD_LABEL], name)

    return reg


def informers_for(controller: Controller, namespaces: list[str]) -> Informers:
    """One informer per child kind and one for pool pods, per namespace watched (one cluster-wide for all)."""
    informers = Informers()

    def sources(name: str, group: str, version: str, plural: str, selector: str) -> list[Source]:
        base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        if not namespaces or any(c in ns for ns in namespaces for c in "*?[!"):
            # All namespaces, or kopf's namespace patterns: one watch cluster-wide (owners outside the patterns are
            # never known, so their objects poke nothing).
            return [Source(name, f"{base}/{plural}", selector)]
        return [Source(f"{name} in {ns}", f"{base}/namespaces/{ns}/{plural}", selector, ns) for ns in namespaces]

    for kind in CHILD_KINDS:
        informers.add(kind.plural, controller.kube, sources(kind.plural, kind.group, kind.version, kind.plural,
                                                            L.INSTANCE),
                      _child_summary(kind), _child_changed(controller))

    def pod_changed(key: tuple[str, str], _pod: Any, _deleted: bool) -> None:
        controller.poke(key)

    informers.add("pods", controller.kube, sources("pods", "", "v1", "pods", POOL_PODS), _pod_summary, pod_changed)
    return informers


def _owner_of(body: dict[str, Any]) -> tuple[str, str] | None:
    meta = body.get("metadata") or {}
    instance = (meta.get("labels") or {}).get(L.INSTANCE)
    return (meta.get("namespace") or "", instance) if instance else None


def _child_summary(kind: ChildKind) -> Any:
    def summarize(body: dict[str, Any]) -> tuple[tuple[str, str], Any] | None:
        owner = _owner_of(body)
        return (owner, child_of(body, workload=kind.workload)) if owner is not None else None
    return summarize


def _pod_summary(body: dict[str, Any]) -> tuple[tuple[str, str], Any] | None:
    owner = _owner_of(body)
    return (owner, pod_of(body)) if owner is not None else None


def _child_changed(controller: Controller) -> Any:
    def changed(key: tuple[str, str], child: Any, deleted: bool) -> None:
        controller.child_event(key, child.ref, deleted=deleted, uid=child.uid)
    return changed


async def _resync(controller: Controller, seconds: float) -> None:
    """Converge every SpecServing now and then: a safety net for lost events. In sync, it costs no request."""
    while True:
        await asyncio.sleep(seconds)
        await controller.resync()
