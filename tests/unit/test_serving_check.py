"""ServingVerified: the condition from a check's result, the rollout a check belongs to, its backoff, and the
HTTP exchange against a real local server (the router's side is the cluster tier's test_router.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specserving.reconcile import reasons as R
from specserving.reconcile.observed import pod_of
from specserving.reconcile.serving import Result, describe_answer, post_json, retry_delay, rollout_of
from specserving.reconcile.status import Observation, compute

from .test_reconcile_status import T0, cond, deployment, observe, pod


def _observed(serving_check: bool, result: Result | None, ready: bool = True) -> Observation:
    o = observe(workloads=None if ready else {"decode": deployment("sv-decode", 2, 1)})
    return dataclasses.replace(o, serving_check=serving_check, serving=result)


def test_no_condition_when_the_check_is_off() -> None:
    s = compute(_observed(False, None), T0)
    assert R.SERVING_VERIFIED not in {c["type"] for c in s["conditions"]}


@pytest.mark.parametrize(("ready", "result", "status", "reason"), [
    (False, None, "Unknown", R.WAITING_FOR_READY),
    (True, None, "Unknown", R.CHECKING),
    (True, Result("r", True, R.REQUEST_SERVED, "served in 12 ms", 1), "True", R.REQUEST_SERVED),
    (True, Result("r", False, R.REQUEST_FAILED, "answered HTTP 500", 3), "False", R.REQUEST_FAILED),
], ids=["waits-for-ready", "checking", "served", "failed"])
def test_serving_verified_condition(ready: bool, result: Result | None, status: str, reason: str) -> None:
    s = compute(_observed(True, result, ready), T0)
    c = cond(s, R.SERVING_VERIFIED)
    assert (c["status"], c["reason"], c["observedGeneration"]) == (status, reason, 3)
    # Never part of Ready: a failing check leaves Ready as the pools make it.
    assert cond(s, R.READY)["status"] == ("True" if ready else "False")


def test_a_rollout_is_the_generation_and_its_ready_pods() -> None:
    a = pod_of({**pod("p-0", "prefill"), "metadata": {"name": "p-0", "uid": "u1", "labels": {"specserving.io/role": "prefill"}}})
    b = pod_of({**pod("d-0", "decode"), "metadata": {"name": "d-0", "uid": "u2", "labels": {"specserving.io/role": "decode"}}})
    c = pod_of({**pod("d-1", "decode", ready=False), "metadata": {"name": "d-1", "uid": "u3",
                                                                  "labels": {"specserving.io/role": "decode"}}})
    assert rollout_of(3, [b, a, c]) == rollout_of(3, [a, b]) == "3:u1,u2"
    assert rollout_of(4, [a, b]) != rollout_of(3, [a, b])


def test_backoff_doubles_up_to_five_minutes() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert retry_delay(20) == 300.0


def test_the_answer_names_the_pods_only_when_the_engines_do() -> None:
    stand_in = {"text": "x", "meta_info": {"stand_in": {"pod": "d-0", "prefill_pod": "p-0"}}}
    assert describe_answer(json.dumps(stand_in).encode()) == "decode pod d-0 answered with KV from prefill pod p-0"
    assert "do not name" in describe_answer(b'{"text": "x", "meta_info": {"id": "1"}}')
    assert "not JSON" in describe_answer(b"<html>")
    completion = {"object": "text_completion", "choices": [{"text": "x"}], "stand_in": {"pod": "d-1", "prefill_pod": "p-1"}}
    assert describe_answer(json.dumps(completion).encode()) == "decode pod d-1 answered with KV from prefill pod p-1"


class _Answer(BaseHTTPRequestHandler):
    code = 200

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"echo": json.loads(body), "path": self.path}).encode()
        self.send_response(self.code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_post_json_reads_the_whole_answer(server: ThreadingHTTPServer) -> None:
    code, body = asyncio.run(post_json("127.0.0.1", server.server_address[1], "/generate", {"text": "t"}, 5))
    assert code == 200 and json.loads(body) == {"echo": {"text": "t"}, "path": "/generate"}


def test_post_json_reports_error_codes(server: ThreadingHTTPServer) -> None:
    _Answer.code = 503
    try:
        code, _ = asyncio.run(post_json("127.0.0.1", server.server_address[1], "/generate", {}, 5))
    finally:
        _Answer.code = 200
    assert code == 503


def test_post_json_fails_fast_when_nothing_listens() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    port = srv.server_address[1]
    srv.server_close()
    with pytest.raises(OSError):
        asyncio.run(post_json("127.0.0.1", port, "/generate", {}, 5))
