"""The informer's store and its recovery, against a scripted API (the real API server's side is
tests/cluster/test_informer.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from specserving.kube import ApiError
from specserving.reconcile.informer import Informers, Source

OWNER = "specserving.io/instance"


def _obj(name: str, owner: str | None, rv: str, value: str = "", listed: bool = False) -> dict[str, Any]:
    labels = {OWNER: owner} if owner else {}
    kind = {} if listed else {"apiVersion": "v1", "kind": "Thing"}
    return {**kind, "metadata": {"name": name, "namespace": "ns", "labels": labels, "resourceVersion": rv},
            "v": value}


def _summary(body: dict[str, Any]) -> tuple[tuple[str, str], Any] | None:
    assert (body["apiVersion"], body["kind"]) == ("v1", "Thing"), body  # listed items are given both
    owner = body["metadata"]["labels"].get(OWNER)
    return (("ns", owner), (body["metadata"]["name"], body["v"])) if owner else None


class Stream:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        text = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.chunks = [text[i:i + 7] for i in range(0, len(text), 7)]  # lines split across chunks

    def stream(self, _amt: int) -> Any:
        return iter(self.chunks)

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class ScriptedApi:
    """Answers each list with the next of `lists` and each watch with the next of `watches`; then blocks."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]] | ApiError]) -> None:
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []
        self.done = threading.Event()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if not self.lists:
            self.done.wait()
            raise ApiError(0, "Stopped", "")
        items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in self.lists.pop(0)]
        version = str(100 + len(self.watched_from))
        return {"apiVersion": "v1", "kind": "ThingList", "items": items, "metadata": {"resourceVersion": version}}

    def open_stream(self, path: str, query: dict[str, Any], read_seconds: float) -> Stream:
        self.watched_from.append(query["resourceVersion"])
        if not self.watches:
            self.done.wait()
            raise ApiError(0, "Stopped", "")
        nxt = self.watches.pop(0)
        if isinstance(nxt, ApiError):
            raise nxt
        return Stream(nxt)


def _run(api: ScriptedApi, until: Any) -> tuple[dict[Any, list[Any]], list[tuple[Any, Any, bool]]]:
    seen: list[tuple[Any, Any, bool]] = []

    async def scenario() -> dict[Any, list[Any]]:
        informers = Informers()
        informers.add("things", api, [Source("things", "/api/v1/things", OWNER)], _summary,  # type: ignore[arg-type]
                      lambda *change: seen.append(change))
        informers.start()
        try:
            await asyncio.wait_for(informers.wait_synced(), 5)
            for _ in range(500):
                if until(seen):
                    break
                await asyncio.sleep(0.01)
            return {k: sorted(v) for k, v in informers.view("things").items()}
        finally:
            api.done.set()
            informers.stop()

    return asyncio.run(scenario()), seen


def test_watch_events_split_across_chunks_update_the_store_and_bookmarks_move_the_version() -> None:
    api = ScriptedApi(
        lists=[[_obj("a", "x", "10", "1")]],
        watches=[[{"type": "MODIFIED", "object": _obj("a", "x", "11", "2")},
                  {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                  {"type": "ADDED", "object": _obj("b", "y", "16", "1")},
                  {"type": "MODIFIED", "object": _obj("b", None, "17")},  # lost its owner label: gone from here
                  {"type": "ADDED", "object": _obj("c", "x", "18", "1")},
                  {"type": "DELETED", "object": _obj("a", "x", "19", "2")}]])
    # The thread hands over the events before it opens the next watch: wait for both (a loaded CI machine took
    # the assertion below before the second watch was open).
    store, seen = _run(api, lambda seen: len(seen) >= 6 and len(api.watched_from) >= 2)
    assert store == {("ns", "x"): [("c", "1")]}
    assert seen == [(("ns", "x"), ("a", "1"), False), (("ns", "x"), ("a", "2"), False),
                    (("ns", "y"), ("b", "1"), False), (("ns", "y"), ("b", "1"), True),
                    (("ns", "x"), ("c", "1"), False), (("ns", "x"), ("a", "2"), True)]
    assert api.watched_from[:2] == ["100", "19"]  # the next watch starts after the last event


def test_an_expired_version_lists_again_and_what_the_new_list_lacks_was_deleted() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    api = ScriptedApi(lists=[[_obj("a", "x", "10"), _obj("b", "x", "11")], [_obj("b", "x", "12", "new")]],
                      watches=[[gone]])
    store, seen = _run(api, lambda seen: any(deleted for *_, deleted in seen))
    assert store == {("ns", "x"): [("b", "new")]}
    assert (("ns", "x"), ("a", ""), True) in seen


def test_a_failed_watch_is_retried_from_the_same_version() -> None:
    api = ScriptedApi(lists=[[]], watches=[ApiError(0, "Unreachable", "connection refused"),
                                           [{"type": "ADDED", "object": _obj("a", "x", "20")}]])
    store, _ = _run(api, lambda seen: bool(seen))
    assert store == {("ns", "x"): [("a", "")]}
    assert api.watched_from[:2] == ["100", "100"]


def test_a_kind_not_served_lists_as_empty_until_a_pass_finds_it_served() -> None:
    class Missing(ScriptedApi):
        def request(self, method: str, path: str, **kw: Any) -> Any:
            if not self.watched_from and self.lists and self.lists[0] == []:
                self.lists.pop(0)
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return super().request(method, path, **kw)

    api = Missing(lists=[[], [_obj("a", "x", "5")]], watches=[])

    async def scenario() -> tuple[bool, dict[Any, list[Any]]]:
        informers = Informers()
        informers.add("things", api, [Source("things", "/apis/g/v1/things", OWNER)], _summary,  # type: ignore[arg-type]
                      lambda *change: None)
        informers.start()
        try:
            await asyncio.wait_for(informers.wait_synced(), 5)
            missing = informers.by_kind["things"][0].missing
            informers.served("things")
            for _ in range(500):
                if informers.view("things"):
                    break
                await asyncio.sleep(0.01)
            return missing, {k: sorted(v) for k, v in informers.view("things").items()}
        finally:
            api.done.set()
            informers.stop()

    missing, store = asyncio.run(scenario())
    assert missing and store == {("ns", "x"): [("a", "")]}
