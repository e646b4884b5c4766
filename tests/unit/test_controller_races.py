"""Races the crash test found, pinned down without a cluster: the controller with a fake API and plain indexes.

1. A child the operator creates and that is deleted at once (the garbage collector finishing an old owner's work,
   a hand delete) may show up as a DELETED event before the operator's own apply call has returned. The next pass
   must apply it again; it used to take the missing child for "applied, the watch has not caught up" for ever.
2. A SpecServing deleted while its pass runs: the status write finds nothing (404). That ends the pass quietly; it
   used to raise, retry with backoff and reach kopf's log as a traceback.
3. A SpecServing whose namespace is being deleted: the API server refuses new children there (403, cause
   NamespaceTerminating). That ends the pass quietly too; it used to report ApplyFailed, post a Warning event and
   reach kopf's log as "Handler 'reconcile' failed temporarily: ... forbidden", which reads like missing RBAC.
4. The dry run before an apply: a RoleBinding whose Role the same wave creates cannot be dry-run under the chart's
   ServiceAccount (the RBAC check looks the Role up: 404). That child is left to the real apply; the dry run
   used to raise, and no child was ever applied. An invalid child (422) still blocks the whole rendering.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from specserving.api.loading import spec_of
from specserving.kube import ApiError, Resource
from specserving.metrics import APPLIED, Metrics
from specserving.reconcile.compact import unpack
from specserving.reconcile.controller import Controller
from specserving.reconcile.events import flush
from specserving.reconcile.observed import child_of, ref_of
from specserving.reconcile.watched import OWNER_INDEX, POD_INDEX, StoredOwner, child_index
from specserving.rendering import render
from specserving.rendering.kinds import CHILD_KINDS

SEED = Path(__file__).resolve().parents[2] / "examples" / "dspark-pd-tp8dp8.yaml"
KEY = ("ns", "dsv4-flash")


class FakeKube:
    """Answers discovery for every kind, records applies and status patches."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.on_apply: dict[tuple[str, str], Any] = {}
        self.status_error: ApiError | None = None
        self.apply_error: ApiError | None = None
        self.dry_run_errors: dict[str, ApiError] = {}  # kind -> what its dry run answers
        self.dry_run: list[str] = []  # the names of the children dry-run
        self.status_patches: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.stored: list[dict[str, Any]] = []  # each applied child as stored: what the watch would show
        self.serial = 0

    def resource(self, api_version: str, kind: str) -> Resource:
        return Resource(api_version, kind, kind.lower() + "s", True)

    def cached(self, api_version: str) -> None:
        return None  # every lookup goes through resource()

    def apply(self, res: Resource, obj: dict[str, Any], *, dry_run: bool = False,
              metadata_only: bool = False) -> dict[str, Any]:
        # Whole objects even when metadata_only asks for less: the tests keep them as what the watch shows.
        if self.apply_error is not None:
            raise self.apply_error
        if dry_run:
            self.dry_run.append(obj["metadata"]["name"])
            if obj["kind"] in self.dry_run_errors:
                raise self.dry_run_errors[obj["kind"]]
            return copy.deepcopy(obj)
        self.serial += 1
        what = (obj["kind"], obj["metadata"]["name"])
        self.applied.append(what)
        out = copy.deepcopy(obj)
        out["metadata"].update(uid=f"uid-{self.serial}", resourceVersion=str(self.serial))
        if what in self.on_apply:
            self.on_apply.pop(what)(out)
        self.stored.append(out)
        return out

    def merge_patch(self, res: Resource, namespace: str | None, name: str, patch: dict[str, Any],
                    subresource: str | None = None, *, metadata_only: bool = False) -> dict[str, Any]:
        if subresource == "status":
            if self.status_error is not None:
                raise self.status_error
            self.status_patches.append(patch)
        return {}

    def create_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(reason)


def owner() -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(SEED.read_text())
    obj["metadata"].update(namespace=KEY[0], uid="owner-1", generation=1)
    return obj


def controller(kube: FakeKube, body: dict[str, Any]) -> Controller:
    c = Controller(kube, Metrics(CollectorRegistry()), probe_load=False)  # type: ignore[arg-type]
    c.indices = {OWNER_INDEX: {KEY: [StoredOwner.of(body)]}, POD_INDEX: {}, **{child_index(k): {} for k in CHILD_KINDS}}
    return c


def observe(c: Controller, children: list[dict[str, Any]]) -> None:
    """The watch shows exactly `children` (as the API returned them)."""
    for kind in CHILD_KINDS:
        found = [child_of(ch, workload=kind.workload) for ch in children if ch["kind"] == kind.kind]
        c.indices[child_index(kind)] = {KEY: found} if found else {}  # type: ignore[index]


def test_a_child_deleted_before_our_apply_returned_is_applied_again() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)
    pdb = ("PodDisruptionBudget", "dsv4-flash-decode")

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def deleted_at_once(out: dict[str, Any]) -> None:
            # Runs in the apply thread: the DELETED event is queued before the apply call's result.
            loop.call_soon_threadsafe(lambda: c.child_event(KEY, ref_of(out), deleted=True,
                                                            uid=out["metadata"]["uid"]))

        kube.on_apply[pdb] = deleted_at_once
        assert await c.reconcile(KEY, body) == APPLIED
        assert pdb in kube.applied
        await asyncio.sleep(0)  # let the queued DELETED event and its poke run
        # The watch shows every child but the deleted one.
        observe(c, [ch for ch in kube.stored if (ch["kind"], ch["metadata"]["name"]) != pdb])
        kube.applied.clear()
        assert await c.reconcile(KEY, body) == APPLIED
        assert kube.applied == [pdb], "the deleted child must be applied again, and nothing else"

    asyncio.run(run())


def test_our_own_apply_not_yet_seen_is_not_applied_twice() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)

    async def run() -> None:
        assert await c.reconcile(KEY, body) == APPLIED
        assert len(kube.applied) == len(render(spec_of(body), body["metadata"]))
        kube.applied.clear()
        assert await c.reconcile(KEY, body) == APPLIED  # the watch has shown nothing yet
        assert kube.applied == []

    asyncio.run(run())


def test_an_owner_deleted_during_its_pass_ends_the_pass_quietly() -> None:
    body = owner()
    kube = FakeKube()
    kube.status_error = ApiError(404, "Not Found", 'specservings.specserving.io "dsv4-flash" not found', "PATCH",
                                 "/apis/specserving.io/v1alpha1/namespaces/ns/specservings/dsv4-flash/status")
    c = controller(kube, body)
    assert asyncio.run(c.reconcile(KEY, body)) == APPLIED


def test_an_owner_in_a_terminating_namespace_ends_the_pass_quietly() -> None:
    body = owner()
    kube = FakeKube()
    kube.apply_error = ApiError(
        403, "Forbidden", 'deployments.apps "dsv4-flash-decode" is forbidden: unable to create new content in '
        "namespace ns because it is being terminated", "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/dsv4-flash-decode", causes=("NamespaceTerminating",))
    c = controller(kube, body)

    async def run() -> str:
        verdict = await c.reconcile(KEY, body)
        await flush()  # the pass queues its Events and goes on: wait for them before judging
        return verdict

    assert asyncio.run(run()) == APPLIED
    assert kube.events == [] and kube.status_patches == [], "nothing reported as a failure"


def test_a_child_the_dry_run_cannot_judge_is_left_to_the_apply() -> None:
    body = owner()
    kube = FakeKube()
    kube.dry_run_errors["Deployment"] = ApiError(404, "Not Found", 'serviceaccounts "dsv4-flash" not found')
    c = controller(kube, body)
    assert asyncio.run(c.reconcile(KEY, body)) == APPLIED
    assert ("Deployment", "dsv4-flash-router") in kube.applied
    assert len(kube.applied) == len(render(spec_of(body), body["metadata"]))


def test_only_the_spec_shaped_children_of_a_new_rendering_are_dry_run_first() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)
    asyncio.run(c.reconcile(KEY, body))
    assert sorted(kube.dry_run) == sorted(name for kind, name in kube.applied if kind == "Deployment")
    assert len(kube.dry_run) == 3 and len(kube.applied) == 11
    body["metadata"]["generation"] = 2  # the same rendering again: nothing changed, nothing dry-run
    kube.dry_run.clear()
    asyncio.run(c.reconcile(KEY, body))
    assert kube.dry_run == []


def test_a_first_apply_sends_each_child_after_what_it_needs() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)
    assert asyncio.run(c.reconcile(KEY, body)) == APPLIED
    kinds = [kind for kind, _ in kube.applied]
    # A RoleBinding's RBAC check reads its Role; a workload's pods name their ServiceAccount.
    assert set(kinds[:-4]) == {"ServiceAccount", "Role", "Service", "PodDisruptionBudget"}, kinds
    assert kinds[-4] == "RoleBinding" and set(kinds[-3:]) == {"Deployment"}, kinds


def test_an_invalid_child_in_the_dry_run_applies_nothing() -> None:
    body = owner()
    kube = FakeKube()
    kube.dry_run_errors["Deployment"] = ApiError(422, "Invalid", 'Deployment "x" is invalid: spec.template: bad')
    c = controller(kube, body)
    try:
        asyncio.run(c.reconcile(KEY, body))
    except Exception as exc:  # the pass ends blocked, to be retried later
        assert "InvalidRenderedConfig" in str(exc), exc
    assert kube.applied == []
    assert "InvalidRenderedConfig" in str(kube.status_patches[-1])


def test_a_watch_view_from_before_our_status_write_does_not_write_it_again() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)

    async def run() -> None:
        assert await c.reconcile(KEY, body) == APPLIED
        assert len(kube.status_patches) == 1
        # The watch has not shown our write yet: the same body (its old status) comes back for the next pass.
        assert await c.reconcile(KEY, body) == APPLIED
        assert len(kube.status_patches) == 1, "the status just written was written again"
        # A status changed by someone else since is judged against what the watch shows now.
        changed = {**body, "status": {"phase": "Tampered"}}
        assert await c.reconcile(KEY, changed) == APPLIED
        assert len(kube.status_patches) == 2

    asyncio.run(run())


def test_once_the_watch_shows_our_status_write_the_pass_keeps_no_copy_of_it() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)

    async def run() -> None:
        assert await c.reconcile(KEY, body) == APPLIED
        written = c.owners[KEY].written
        assert written is not None
        caught_up = {**body, "status": unpack(written[1], written[2])}
        assert await c.reconcile(KEY, caught_up) == APPLIED
        assert c.owners[KEY].written is None, "the status written is still held after the watch showed it"
        assert len(kube.status_patches) == 1

    asyncio.run(run())


def alike(name: str, uid: str, namespace: str = KEY[0]) -> dict[str, Any]:
    """The seed SpecServing under another name and uid: the same shape (reconcile/accepted.py)."""
    body = owner()
    body["metadata"].update(name=name, namespace=namespace, uid=uid)
    return body


def watching(c: Controller, *bodies: dict[str, Any]) -> None:
    stored = {(b["metadata"]["namespace"], b["metadata"]["name"]): [StoredOwner.of(b)] for b in bodies}
    c.indices[OWNER_INDEX] = stored  # type: ignore[index]


def reconcile(c: Controller, body: dict[str, Any]) -> str:
    return asyncio.run(c.reconcile((body["metadata"]["namespace"], body["metadata"]["name"]), body))


def test_a_new_specserving_shaped_like_one_just_accepted_is_not_dry_run_again() -> None:
    first, second, elsewhere = owner(), alike("dsv4-flash-2", "owner-2"), alike("dsv4-flash", "owner-3", "other")
    other_spec = alike("dsv4-flash-4", "owner-4")
    other_spec["spec"]["prefill"]["replicas"] = 2
    kube = FakeKube()
    c = controller(kube, first)
    watching(c, first, second, elsewhere, other_spec)
    reconcile(c, first)
    assert len(kube.dry_run) == 3
    reconcile(c, second)
    assert len(kube.dry_run) == 3, "the same spec in the same namespace was dry-run again"
    assert sum(1 for kind, name in kube.applied if name.startswith("dsv4-flash-2")) == 11
    reconcile(c, elsewhere)  # another namespace may have other admission policies
    assert len(kube.dry_run) == 6
    reconcile(c, other_spec)
    assert len(kube.dry_run) == 9


def test_a_refused_or_unjudged_dry_run_is_not_remembered() -> None:
    first, second, third = owner(), alike("dsv4-flash-2", "owner-2"), alike("dsv4-flash-3", "owner-3")
    kube = FakeKube()
    c = controller(kube, first)
    watching(c, first, second, third)
    kube.dry_run_errors["Deployment"] = ApiError(422, "Invalid", 'Deployment "x" is invalid: spec.template: bad')
    try:
        reconcile(c, first)
    except Exception as exc:  # noqa: BLE001 - blocked, as the test above shows
        assert "InvalidRenderedConfig" in str(exc), exc
    kube.dry_run_errors["Deployment"] = ApiError(404, "Not Found", 'serviceaccounts "x" not found')
    reconcile(c, second)  # left to the apply: applied, but not proof for the next one
    assert len(kube.dry_run) == 6
    del kube.dry_run_errors["Deployment"]
    reconcile(c, third)
    assert len(kube.dry_run) == 9


def test_a_change_to_running_workloads_neither_uses_nor_fills_the_accepted_shapes() -> None:
    first, second = owner(), alike("dsv4-flash-2", "owner-2")
    kube = FakeKube()
    c = controller(kube, first)
    watching(c, first, second)
    reconcile(c, first)
    observe(c, [{**child, "metadata": {**child["metadata"], "uid": "seen", "resourceVersion": "1"}}
                for child in render(spec_of(first), first["metadata"])])
    changed = copy.deepcopy(first)
    changed["metadata"]["generation"] = 2
    changed["spec"]["prefill"]["replicas"] = 2
    changed["spec"]["decode"]["replicas"] = 3  # two workloads change: one could be applied and the other refused
    watching(c, changed, second)
    kube.dry_run.clear()
    reconcile(c, changed)  # the pool Deployments exist: their dry runs are judged against them
    assert kube.dry_run, "a change to running workloads was not dry-run"
    second["spec"]["prefill"]["replicas"] = 2
    watching(c, changed, second)
    kube.dry_run.clear()
    reconcile(c, second)  # the change above was no creation: it proves nothing for a new SpecServing
    assert len(kube.dry_run) == 3


def scaled(kube: FakeKube, c: Controller) -> dict[str, Any]:
    """The seed, applied and seen by the watch, then its decode pool scaled from 2 to 3: one child to apply."""
    body = owner()
    reconcile(c, body)
    observe(c, json.loads(json.dumps(kube.stored)))
    changed = copy.deepcopy(body)
    changed["metadata"]["generation"] = 2
    changed["spec"]["decode"]["replicas"] = 3
    kube.applied.clear()
    kube.dry_run.clear()
    return changed


def test_a_change_of_one_child_is_applied_without_a_dry_run_first() -> None:
    kube = FakeKube()
    c = controller(kube, owner())
    assert reconcile(c, scaled(kube, c)) == APPLIED
    assert [(kind, name.rsplit("-", 1)[0]) for kind, name in kube.applied] == [("Deployment", "dsv4-flash-decode")]
    assert kube.dry_run == [], "a lone change cannot be half-applied: its dry run is a round trip for nothing"


def test_a_lone_child_the_api_server_refuses_blocks_as_its_dry_run_would() -> None:
    kube = FakeKube()
    c = controller(kube, owner())
    changed = scaled(kube, c)
    kube.apply_error = ApiError(422, "Invalid", 'Deployment "x" is invalid: spec.replicas: bad')
    try:
        reconcile(c, changed)
        raise AssertionError("the refused apply did not block the pass")
    except Exception as exc:  # noqa: BLE001 - blocked, to be retried later
        assert "InvalidRenderedConfig" in str(exc) and "Deployment dsv4-flash-decode" in str(exc), exc
    assert "InvalidRenderedConfig" in str(kube.status_patches[-1])
    assert "ChildApplyFailed" not in kube.events


def test_a_pass_in_sync_holds_the_watchs_copy_of_each_childs_version_and_uid() -> None:
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)

    async def run() -> None:
        assert await c.reconcile(KEY, body) == APPLIED
        observe(c, json.loads(json.dumps(kube.stored)))  # decoded from a watch event: strings of their own
        kube.applied.clear()
        assert await c.reconcile(KEY, body) == APPLIED
        assert kube.applied == []
        seen = c.children(KEY)
        for ref, mine in c.owners[KEY].applied.items():
            assert mine.uid is seen[ref].uid and mine.resource_version is seen[ref].resource_version, ref

    asyncio.run(run())


def test_a_pool_that_goes_down_again_after_a_quiet_rise_is_posted_again() -> None:
    """A pool's rise to True posts no Event (Ready's does), but it is remembered: without that, the pool's second
    fall looked like a repeat of its first and was never posted."""
    body = owner()
    kube = FakeKube()
    c = controller(kube, body)
    c.serving.enabled = False  # no router to ask

    def pools(decode_ready: bool) -> None:
        shown = []
        for ch in kube.stored:
            ch = copy.deepcopy(ch)
            if ch["kind"] == "Deployment":
                want = int(ch["spec"].get("replicas", 1))
                ready = want if decode_ready or ch["metadata"]["labels"]["specserving.io/role"] != "decode" \
                    else want - 1
                ch["status"] = {"replicas": want, "readyReplicas": ready, "updatedReplicas": want}
            shown.append(ch)
        observe(c, shown)

    async def run() -> list[str]:
        await c.reconcile(KEY, body)
        for decode_ready in (True, False, True, False):
            pools(decode_ready)
            await c.reconcile(KEY, body)
        await flush()
        return kube.events

    posted = asyncio.run(run())
    assert "AllPoolsReady" in posted
    assert posted.count("ReplicasNotReady") == 2, posted  # DecodeReady fell twice, and each fall is an Event
    assert "ReplicasReady" not in posted, posted  # the pools' rises are not
