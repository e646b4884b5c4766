"""ServingVerified: after each rollout, one short completion request through the router's Service.

A rollout here is one set of Ready prefill, decode and router pods under one generation: when that set changes
(a new generation rolled out, a pod replaced, a pool scaled) and the SpecServing is Ready, one check runs in the
background. It never holds up a converge pass nor the Ready condition; a failure retries with backoff until it
passes or the rollout changes. The request is a real one through the real router, so it passes only if the router
has registered a prefill and a decode pod, paired them (bootstrap host, port and room) and the decode answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from specserving.kube import ApiError, Kube, Resource
from specserving.reconcile.calls import call
from specserving.reconcile import reasons as R
from specserving.reconcile.observed import Pod
from specserving.reconcile.state import Key
from specserving.rendering import labels as L

log = logging.getLogger("specserving.serving")

SERVICES = Resource("v1", "Service", "services", True)
# The OpenAI completions route, with the model named: smg's service discovery serves several models (IGW) and
# refuses a /generate without one, and SGLang's native /generate has no model field to name it in.
PATH = "/v1/completions"


def request_for(model: str) -> dict[str, object]:
    return {"model": model, "prompt": "SpecServing serving check", "max_tokens": 1, "temperature": 0}
ANSWER_TIMEOUT_SECONDS = 60.0  # a cold engine's first request may compile kernels
CONNECT_TIMEOUT_SECONDS = 10.0
MAX_ANSWER_BYTES = 1 << 20  # a cold engine's first request may compile kernels; the router's own timeout is longer
FIRST_RETRY_SECONDS = 5.0
MAX_RETRY_SECONDS = 300.0
BODY_EXCERPT = 300


@dataclass(frozen=True)
class Target:
    """Where the check sends its request: the router Service of one SpecServing."""

    namespace: str
    service: str
    port: int
    model: str  # the served model name the router knows the workers by


@dataclass(frozen=True)
class Result:
    """The outcome of one check of one rollout."""

    rollout: str
    ok: bool
    reason: str
    message: str
    attempt: int


def rollout_of(generation: int, pods: Iterable[Pod]) -> str:
    """The rollout a check belongs to: the generation and the Ready pods serving it."""
    serving = sorted(p.uid for p in pods if p.ready and not p.deleting and p.role in (L.PREFILL, L.DECODE, L.ROUTER))
    return f"{generation}:{','.join(serving)}"


def retry_delay(attempt: int) -> float:
    """Seconds before attempt `attempt + 1` after `attempt` failures: 5, 10, 20, ... up to 5 minutes."""
    return float(min(FIRST_RETRY_SECONDS * 2 ** (attempt - 1), MAX_RETRY_SECONDS))


def describe_answer(body: bytes) -> str:
    """What the answer says about who served it: the stand-in engines name the pods; SGLang does not."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "the answer is not JSON"
    if not isinstance(doc, dict):
        return "the answer is not a JSON object"
    meta = doc.get("meta_info")
    pods = doc.get("stand_in") or (meta.get("stand_in") if isinstance(meta, dict) else None)
    if isinstance(pods, dict) and pods.get("pod"):
        return f"decode pod {pods.get('pod')} answered with KV from prefill pod {pods.get('prefill_pod')}"
    return "the engines do not name the pods that answered"


class ServingChecks:
    """The running checks and their latest results, per SpecServing."""

    def __init__(self, kube: Kube, poke: Callable[[Key], None], *, enabled: bool = True,
                 timeout: float = ANSWER_TIMEOUT_SECONDS) -> None:
        self.kube, self.poke, self.enabled, self.timeout = kube, poke, enabled, timeout
        self.results: dict[Key, Result] = {}
        self.tasks: dict[Key, tuple[str, asyncio.Task[None]]] = {}

    def result(self, key: Key, rollout: str) -> Result | None:
        """The latest result for this rollout; None while its first attempt runs (or none was started)."""
        found = self.results.get(key)
        return found if found is not None and found.rollout == rollout else None

    def ensure(self, key: Key, rollout: str, target: Target) -> None:
        """Check this rollout unless a check of it runs or has passed; a check of an older rollout is cancelled."""
        running = self.tasks.get(key)
        if running is not None and running[0] == rollout and not running[1].done():
            return
        done = self.result(key, rollout)
        if done is not None and done.ok:
            return
        self.stop(key)
        self.tasks[key] = (rollout, asyncio.get_running_loop().create_task(
            self._check(key, rollout, target), name=f"serving-check {key[0]}/{key[1]}"))

    def stop(self, key: Key) -> None:
        running = self.tasks.pop(key, None)
        if running is not None:
            running[1].cancel()

    def forget(self, key: Key) -> None:
        self.stop(key)
        self.results.pop(key, None)

    async def _check(self, key: Key, rollout: str, target: Target) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                ok, reason, message = await self.send(target)
            except Exception as exc:  # noqa: BLE001 (reported in the condition and logged, never swallowed)
                log.exception("serving check of %s/%s failed unexpectedly", *key)
                ok, reason, message = False, R.REQUEST_FAILED, f"the check itself failed: {exc!r}"
            if not ok:
                message += f" (attempt {attempt}; next in {retry_delay(attempt):.0f}s)"
            self.results[key] = Result(rollout, ok, reason, message, attempt)
            self.poke(key)
            if ok:
                return
            await asyncio.sleep(retry_delay(attempt))

    async def send(self, target: Target) -> tuple[bool, str, str]:
        """One POST /v1/completions through the router Service's cluster IP (the operator may run outside the cluster's
        DNS): (passed, reason, message). Plain asyncio streams, so a cancelled check stops at once."""
        try:
            svc = await call(self.kube.get, SERVICES, target.namespace, target.service)
        except ApiError as exc:
            return False, R.ROUTER_UNREACHABLE, f"cannot read Service {target.service}: {exc}"
        address = ((svc or {}).get("spec") or {}).get("clusterIP")
        if not address or address == "None":
            return False, R.ROUTER_UNREACHABLE, f"Service {target.service} has no cluster IP yet"
        host = f"[{address}]" if ":" in address else address
        where = f"POST http://{host}:{target.port}{PATH} (Service {target.service})"
        started = time.monotonic()
        try:
            code, body = await post_json(address, target.port, PATH, request_for(target.model), self.timeout)
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            why = "timed out" if isinstance(exc, asyncio.TimeoutError) else (str(exc) or type(exc).__name__)
            return False, R.ROUTER_UNREACHABLE, f"{where} failed after {_ms(started)}: {why}"
        if code != 200:
            excerpt = body[:BODY_EXCERPT].decode(errors="replace").strip()
            return False, R.REQUEST_FAILED, f"{where} answered HTTP {code} after {_ms(started)}: {excerpt}"
        return True, R.REQUEST_SERVED, f"{where} served in {_ms(started)}: {describe_answer(body)}"


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """The answer up to EOF, at most MAX_ANSWER_BYTES (the rest is not needed for a verdict)."""
    chunks, size = [], 0
    while size < MAX_ANSWER_BYTES:
        chunk = await reader.read(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def post_json(host: str, port: int, path: str, doc: Mapping[str, object], timeout: float) -> tuple[int, bytes]:
    """HTTP/1.0 POST (so the answer is never chunked and ends at EOF): (status code, body)."""
    payload = json.dumps(doc).encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_SECONDS)
    try:
        writer.write(f"POST {path} HTTP/1.0\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        await writer.drain()
        raw = await asyncio.wait_for(read_to_end(reader), timeout)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass  # the answer (or the failure) is already in hand; a reset on close changes nothing
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError(f"not an HTTP answer: {head[:80]!r}")
    return int(status_line[1]), body


def _ms(started: float) -> str:
    return f"{(time.monotonic() - started) * 1000:.0f} ms"


def condition_fields(enabled: bool, ready: bool, result: Result | None) -> tuple[str, str, str] | None:
    """(status, reason, message) of ServingVerified, or None when the check is switched off (no condition)."""
    if not enabled:
        return None
    if not ready:
        return "Unknown", R.WAITING_FOR_READY, "a request is sent through the router once the SpecServing is Ready"
    if result is None:
        return "Unknown", R.CHECKING, "a request through the router is on its way"
    return ("True" if result.ok else "False"), result.reason, result.message


