"""Our own list-and-watch of the objects the operator owns in bulk: the children of every kind and the pool pods.

kopf watched these before, and for each watched object it kept a per-object memory, ran its cause detection and
built three loggers per watch event; with 1,000 SpecServings that was 14,000 objects and about 40,000 events in a
burst (issue 21's profiles: kopf's event processing was a third of the operator's CPU, its memories about 900 bytes
per object). What the passes read of these objects is a small summary (reconcile/observed.py), so an informer here
does what a controller-runtime cache with a transform does: it lists, then watches from the list's
resourceVersion, and keeps the summary of each object only, grouped by the SpecServing that owns it.

Each informer runs in a thread of its own and reads the stream as it arrives (the GIL is free while it waits);
the decoding and summarizing happen there, and the summaries reach the event loop in one callback per chunk read.
The store is changed only on the loop, so the passes read it without a lock.

- A 410 Gone (the watch's resourceVersion is too old) lists again. Objects the new list lacks count as deleted.
- A kind the API server does not serve (an optional CRD: LeaderWorkerSet, ServiceMonitor) counts as listed and
  empty, and is listed again after `wake`: when a pass finds it served (its discovery, before it applies one), or
  at the latest MISSING_RETRY_SECONDS later.
- Lists and watches are not counted in specserving_api_requests_total, as kopf's were not: that counter is the
  passes' calls (the API server's own request metrics see both).
- Any other failure is logged with the kind and the cause, and retried with backoff; an informer that never
  listed keeps the passes waiting (`Informers.wait_synced`) rather than let them see no children and apply them all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from specserving.kube import ApiError, Kube
from specserving.reconcile.state import Key

log = logging.getLogger("specserving.informer")

LIST_PAGE = 500
WATCH_SECONDS = 300  # the API server ends each watch after this; the informer watches again from where it was
MISSING_RETRY_SECONDS = 3600.0  # a safety net: `wake` is what lists a kind that came to be served
# Reconnects after a failure: soon (an API server restart is over in seconds, and the passes wait for the watches),
# and at most every few seconds while it lasts (one request per informer, a dozen in all).
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 5.0

ObjectKey = tuple[str, str]  # (namespace, name)
# body -> (the owning SpecServing's key, the summary kept), or None for an object to leave out
Summarize = Callable[[dict[str, Any]], "tuple[Key, Any] | None"]
# (owner's key, summary, deleted): called on the loop after the store changed
Notify = Callable[[Key, Any, bool], None]


@dataclass(frozen=True, slots=True)
class Source:
    """What one informer watches: an API path (cluster-wide or one namespace's) and a label selector."""

    name: str
    path: str
    selector: str
    namespace: str | None = None  # None: cluster-wide


class ByOwner(Mapping[Key, Any]):
    """A read-only view of an informer's store: owner key -> the summaries of its objects (the shape the passes read
    kopf's indexes in, reconcile/watched.py)."""

    def __init__(self, groups: dict[Key, dict[ObjectKey, Any]]) -> None:
        self._groups = groups

    def __getitem__(self, key: Key) -> Any:
        return self._groups[key].values()

    def __iter__(self) -> Iterator[Key]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


class Store:
    """The summaries of one kind, by owner. The informers of one kind (one per watched namespace) share it: their
    objects never overlap."""

    def __init__(self) -> None:
        self.groups: dict[Key, dict[ObjectKey, Any]] = {}
        self.owner_of: dict[ObjectKey, Key] = {}
        self.view = ByOwner(self.groups)


class Informer:
    def __init__(self, kube: Kube, source: Source, store: Store, summarize: Summarize, notify: Notify) -> None:
        self.kube, self.source, self.summarize, self.notify = kube, source, summarize, notify
        self.groups, self.owner_of = store.groups, store.owner_of
        self.synced = asyncio.Event()
        self.missing = False  # the last list found the kind not served
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    # -- on the loop ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.source.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        stream = self._stream
        if stream is not None:
            try:
                stream.shutdown()  # ends the blocking read in the thread now, not at the watch's timeout
            except Exception:  # noqa: BLE001 - already closed: nothing left to end
                pass

    def wake(self) -> None:
        """Ask for a missing kind again now (a pass found it served)."""
        self._wake.set()

    def _changed(self, changes: list[tuple[ObjectKey, Key | None, Any, bool]]) -> None:
        for obj, owner, summary, deleted in changes:
            old_owner = self.owner_of.get(obj)
            if old_owner is not None and (deleted or old_owner != owner):
                group = self.groups.get(old_owner)
                old = group.pop(obj, None) if group is not None else None
                if group is not None and not group:
                    del self.groups[old_owner]
                del self.owner_of[obj]
                if old is not None:
                    self.notify(old_owner, old, True)
            if not deleted and owner is not None:
                self.groups.setdefault(owner, {})[obj] = summary
                self.owner_of[obj] = owner
                self.notify(owner, summary, False)

    def _listed(self, items: dict[ObjectKey, tuple[Key, Any]], missing: bool = False) -> None:
        """A whole new list: what it lacks was deleted meanwhile."""
        self.missing = missing
        ns = self.source.namespace
        changes: list[tuple[ObjectKey, Key | None, Any, bool]] = [
            (obj, None, None, True) for obj in list(self.owner_of)
            if obj not in items and (ns is None or obj[0] == ns)]
        changes += [(obj, owner, summary, False) for obj, (owner, summary) in items.items()]
        self._changed(changes)
        self.synced.set()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed: the operator is stopping
            self._stopping.set()

    # -- in the thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff, failures = FIRST_BACKOFF_SECONDS, 0
        version: str | None = None
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                    if version is None:  # not served: listed as empty; ask again when woken
                        self._wait(MISSING_RETRY_SECONDS)
                        continue
                    if failures:
                        log.info("%s: listed again after %d failed tries", self.source.name, failures)
                        backoff, failures = FIRST_BACKOFF_SECONDS, 0
                version = self._watch(version)
                if failures:
                    log.info("%s: watching again after %d failed tries", self.source.name, failures)
                backoff, failures = FIRST_BACKOFF_SECONDS, 0
            except ApiError as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 410:
                    log.debug("%s: the watch's resourceVersion expired; listing again", self.source.name)
                    version = None
                    continue
                failures += 1
                # One line per outage, not one per try: a restarting API server fails every informer many times.
                (log.warning if failures == 1 else log.debug)(
                    "%s: list or watch failed (retrying every %.0f s at most until it answers): %s",
                    self.source.name, MAX_BACKOFF_SECONDS, exc)
                self._wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
            except Exception:  # noqa: BLE001 - a watch must outlive a bad event: log it whole, list again
                if self._stopping.is_set():
                    return
                failures += 1
                log.exception("%s: unexpected failure while watching; listing again", self.source.name)
                version = None
                self._wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _list(self) -> str | None:
        items: dict[ObjectKey, tuple[Key, Any]] = {}
        query: dict[str, Any] = {"labelSelector": self.source.selector, "limit": LIST_PAGE}
        while True:
            try:
                page = self.kube.request("GET", self.source.path, query=query, verb="LIST", counted=False)
            except ApiError as exc:
                if exc.status == 404:
                    self._post(self._listed, {}, True)
                    return None
                raise
            # A list's items carry neither apiVersion nor kind; the summaries (and watch events) have both.
            api_version, kind = page.get("apiVersion", ""), str(page.get("kind", "")).removesuffix("List")
            for body in page.get("items") or ():
                body.setdefault("apiVersion", api_version)
                body.setdefault("kind", kind)
                kept = self._summary(body)
                if kept is not None:
                    items[kept[0]] = (kept[1], kept[2])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                self._post(self._listed, items)
                return str(meta.get("resourceVersion", ""))
            query["continue"] = meta["continue"]

    def _summary(self, body: dict[str, Any]) -> tuple[ObjectKey, Key, Any] | None:
        meta = body.get("metadata") or {}
        found = self.summarize(body)
        if found is None:
            return None
        return (meta.get("namespace", ""), meta.get("name", "")), found[0], found[1]

    def _watch(self, version: str) -> str:
        """Watch from `version` until the API server ends the watch; returns the last resourceVersion seen."""
        query = {"labelSelector": self.source.selector, "watch": "true", "resourceVersion": version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": WATCH_SECONDS}
        self._stream = stream = self.kube.open_stream(self.source.path, query, read_seconds=WATCH_SECONDS + 30)
        ended = False
        try:
            pending = b""
            for chunk in _chunks(stream, self.source.path):
                if self._stopping.is_set():
                    break
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                changes: list[tuple[ObjectKey, Key | None, Any, bool]] = []
                for line in lines:
                    if line.strip():
                        version = self._event(json.loads(line), version, changes)
                if changes:
                    self._post(self._changed, changes)
            ended = not self._stopping.is_set()
        finally:
            self._stream = None
            if not ended:
                stream.close()  # unread data left: the connection must not go back to the pool for reuse
            stream.release_conn()
        return version

    def _event(self, event: dict[str, Any], version: str,
               changes: list[tuple[ObjectKey, Key | None, Any, bool]]) -> str:
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise ApiError(int(body.get("code") or 0), str(body.get("reason") or "Error"),
                           str(body.get("message") or ""), "WATCH", self.source.path)
        meta = body.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        obj = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "DELETED":
            changes.append((obj, None, None, True))
            return version
        found = self.summarize(body)
        # An object that lost its owner label is gone from this store: the same as its deletion.
        changes.append((obj, found[0], found[1], False) if found is not None else (obj, None, None, True))
        return version


def _chunks(stream: Any, path: str) -> Iterator[bytes]:
    """The stream's chunks as they arrive; a connection lost midway is an ApiError like any unreachable server."""
    try:
        yield from stream.stream(65536)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ApiError(0, "Unreachable", str(exc), "WATCH", path) from None


class Informers:
    """The operator's informers: started and stopped together; the passes wait until each has listed once."""

    def __init__(self) -> None:
        self.all: list[Informer] = []
        self.by_kind: dict[str, list[Informer]] = {}
        self.stores: dict[str, Store] = {}

    def add(self, kind: str, kube: Kube, sources: list[Source], summarize: Summarize, notify: Notify) -> None:
        store = self.stores.setdefault(kind, Store())
        for source in sources:
            informer = Informer(kube, source, store, summarize, notify)
            self.all.append(informer)
            self.by_kind.setdefault(kind, []).append(informer)

    def start(self) -> None:
        for informer in self.all:
            informer.start()

    def stop(self) -> None:
        for informer in self.all:
            informer.stop()

    async def wait_synced(self) -> None:
        for informer in self.all:
            if not informer.synced.is_set():
                started = time.monotonic()
                await informer.synced.wait()
                log.debug("%s listed after %.1fs of waiting", informer.source.name, time.monotonic() - started)

    def view(self, kind: str) -> ByOwner:
        return self.stores[kind].view

    def served(self, kind: str) -> None:
        """`kind` is served now (a pass's discovery found it): list it if it was not."""
        for informer in self.by_kind.get(kind, ()):
            if informer.missing:
                informer.missing = False
                informer.wake()
