"""The bench's own view of the API server: plain HTTPS requests with the kubeconfig's credentials, and watches that
timestamp every event as it arrives.

The bench does not go through `specserving.kube` (that module counts the operator's requests) nor through kubectl
for what it measures: a watch event's arrival time is when the bench learned that an object exists or changed,
which is as close to "created" as a client can see.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config


class Api:
    """A thread-safe urllib3 pool bound to one cluster (client certificates or a bearer token)."""

    def __init__(self, kubeconfig: str, maxsize: int = 32) -> None:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self.headers = {"Accept": "application/json", "User-Agent": "specserving-bench"}
        token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        if token:
            self.headers["Authorization"] = token
        self.pool = urllib3.PoolManager(
            num_pools=4, maxsize=maxsize, block=False, cert_file=cfg.cert_file, key_file=cfg.key_file,
            ca_certs=cfg.ssl_ca_cert, cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
            retries=False, timeout=urllib3.Timeout(connect=5, read=60))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None, raw: bool = False, data: bytes | None = None) -> tuple[int, Any]:
        """(status, decoded JSON body or text). `data` is a body already encoded."""
        url = self.host + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = dict(self.headers)
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        r = self.pool.request(method, url, body=data, headers=headers)
        if raw:
            return r.status, r.data.decode(errors="replace")
        try:
            return r.status, json.loads(r.data) if r.data else None
        except ValueError:
            return r.status, r.data.decode(errors="replace")

    def apply_webhook_configuration(self, configuration: dict[str, Any]) -> None:
        """Server-side apply of a ValidatingWebhookConfiguration as the bench's field manager."""
        name = configuration["metadata"]["name"]
        status, body = self.request(
            "PATCH", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}",
            configuration, content_type="application/apply-patch+yaml",
            query={"fieldManager": "specserving-bench", "force": "true"})
        if status not in (200, 201):
            raise RuntimeError(f"cannot apply the ValidatingWebhookConfiguration {name}: {status}: {body}")

    def get(self, path: str, **query: str) -> Any:
        status, body = self.request("GET", path, query=query or None)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}: {body}")
        return body

    def text(self, path: str) -> str:
        status, body = self.request("GET", path, raw=True)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}: {body[:500]}")
        return str(body)

    def stream(self, path: str, query: dict[str, str]) -> Iterator[dict[str, Any]]:
        """One watch request: yields each event (decoded) as its line arrives; ends when the server ends it."""
        url = self.host + path + "?" + urllib.parse.urlencode(query)
        r = self.pool.request("GET", url, headers=self.headers, preload_content=False,
                              timeout=urllib3.Timeout(connect=5, read=None))
        try:
            if r.status != 200:
                raise RuntimeError(f"watch {path}: {r.status}: {r.read()[:300]!r}")
            buf = b""
            for chunk in r.stream(None):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            r.release_conn()


Handler = Callable[[str, dict[str, Any], float], None]  # event type, object, arrival time (monotonic)


class Watch(threading.Thread):
    """List-then-watch one resource in one namespace forever (until stop()), calling `handler` per event.

    The initial list is delivered as ADDED events (so an object created before the watch is not missed), and the
    watch restarts from a fresh list when the server expires its resourceVersion.
    """

    def __init__(self, api: Api, path: str, handler: Handler, label_selector: str | None = None) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        self.api, self.path, self.handler, self.selector = api, path, handler, label_selector
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.error: str | None = None

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                query = {"labelSelector": self.selector} if self.selector else {}
                listed = self.api.get(self.path, **query)
                now = time.monotonic()
                for item in listed.get("items", []):
                    self.handler("ADDED", item, now)
                self.synced.set()
                rv = listed["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    q = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
                         "timeoutSeconds": "30", **query}
                    expired = False
                    for ev in self.api.stream(self.path, q):
                        now = time.monotonic()
                        kind, obj = ev.get("type"), ev.get("object") or {}
                        if kind == "ERROR":
                            expired = True
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            self.handler(kind, obj, now)
                        if self._stop.is_set():
                            return
                    if expired:
                        break
            except Exception as exc:  # noqa: BLE001 - a watch must outlive a hiccup; the bench times out if not
                self.error = f"{type(exc).__name__}: {exc}"
                time.sleep(0.5)
