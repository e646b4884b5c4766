"""The one module that talks to the Kubernetes API: credentials, discovery, server-side apply, status patches,
deletes, pod annotations and events.

It wraps the official `kubernetes` client's ApiClient (synchronous: the reconciler calls it through
asyncio.to_thread) and speaks plain dicts. Every request is counted in specserving_api_requests_total, which is
how the operator's own write rate (zero when idle) is measured.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from specserving import __version__
from specserving.rendering.labels import FIELD_MANAGER

USER_AGENT = f"specserving-operator/{__version__}"
APPLY = "application/apply-patch+yaml"  # JSON is YAML, so the body is sent as JSON
MERGE = "application/merge-patch+json"
JSON = "application/json"
# The answer to a write as its metadata only, where the server offers it (the API server does for every verb), else
# the whole object: a caller that reads the new resourceVersion and uid need not receive and decode the spec and
# status of every child it applies.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
TIMEOUT = (5.0, 30.0)  # connect, read
STREAM_CONNECTIONS = 16  # the informers' watches (reconcile/informer.py): one per child kind and pods, per namespace


class StartupError(Exception):
    """The operator cannot start; the message is the one line the user sees."""


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "",
                 causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}".strip())
        self.status, self.reason, self.message = status, reason, message
        self.causes = causes  # the reasons in the Status's details.causes

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted (not a permission problem): nothing to do there."""
        return self.status == 403 and "NamespaceTerminating" in self.causes

    @property
    def transient(self) -> bool:
        """Worth retrying as is: unreachable, a conflict, throttled, or a server error."""
        return self.status in (0, 409, 429) or self.status >= 500

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclass(frozen=True)
class Resource:
    """An API resource as discovery reports it."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{urllib.parse.quote(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(urllib.parse.quote(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


Counter = Callable[[str, str, int], None]  # verb, resource, HTTP status


def _cause(exc: BaseException) -> str:
    """The innermost reason of a connection error ("Connection refused"), not urllib3's nested repr."""
    while isinstance(inner := getattr(exc, "reason", None), BaseException):
        exc = inner
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^\"')]+)", text)
    return m.group(1) if m else text


def _refusal(status: int, reason: str | None, data: bytes | None, method: str, path: str) -> ApiError:
    """The ApiError for a non-2xx answer, with the message and causes of the API server's Status."""
    message = data.decode(errors="replace") if data else ""
    causes: tuple[str, ...] = ()
    try:
        found = json.loads(message)
        causes = tuple(str(c.get("reason", "")) for c in (found.get("details") or {}).get("causes") or ())
        message = found.get("message", message)
    except (ValueError, AttributeError):
        pass
    return ApiError(status, reason or "", message, method, path, causes)


def resource_of(path: str) -> str:
    """The resource (plural, with /subresource) a request path names: /apis/g/v/namespaces/ns/deployments/x ->
    deployments; "" for discovery."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return ""
    return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> k8s.Configuration:
    """Credentials from --kubeconfig, else $KUBECONFIG or ~/.kube/config, else the in-cluster service account."""
    cfg = k8s.Configuration()
    in_cluster = kubeconfig is None and not os.environ.get("KUBECONFIG") and os.environ.get(
        "KUBERNETES_SERVICE_HOST")
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
                "~/.kube/config")
            if not os.path.exists(path):
                raise StartupError(f"kubeconfig {path} does not exist" if kubeconfig else (
                    f"no kubeconfig at {path} and not running in a cluster: pass --kubeconfig or set KUBECONFIG"))
            k8s_config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except k8s_config.ConfigException as exc:
        where = "the in-cluster service account" if in_cluster else "the kubeconfig"
        raise StartupError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    return cfg


class Kube:
    """Plain-dict access to the API server, thread-safe, with discovery cached per apiVersion."""

    def __init__(self, cfg: k8s.Configuration, count: Counter | None = None) -> None:
        self.cfg = cfg
        if not cfg.verify_ssl:  # the kubeconfig asked for it (insecure-skip-tls-verify); say so once, not per call
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.api = k8s.ApiClient(cfg)
        self.api.user_agent = USER_AGENT
        self._count = count or (lambda verb, resource, status: None)
        self._discovery: dict[str, dict[str, Resource]] = {}
        self._lock = threading.Lock()
        self._streams: k8s.ApiClient | None = None

    @property
    def host(self) -> str:
        return str(self.cfg.host)

    # -- requests -------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str | None = None, verb: str | None = None, accept: str = JSON,
                counted: bool = True) -> Any:
        """One API call; returns the decoded JSON body. Raises ApiError on any non-2xx answer. `counted`: False
        for the informers' lists, which the request counter leaves out as it does their watches."""
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        resource = resource_of(path)
        verb = verb or method
        _, url, headers, _, _ = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()) or None, header_params=headers,
            auth_settings=["BearerToken"])
        try:
            resp = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=TIMEOUT)
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if counted:
                self._count(verb, resource, 0)
            raise ApiError(0, "Unreachable", _cause(exc), method, path) from None
        except k8s.ApiException as exc:
            if counted:
                self._count(verb, resource, exc.status or 0)
            raise ApiError(exc.status or 0, exc.reason or "Error", str(exc.body or ""), method, path) from None
        if counted:
            self._count(verb, resource, resp.status)
        if not 200 <= resp.status < 300:
            raise _refusal(resp.status, resp.reason, data, method, path)
        return json.loads(data) if data else None

    def open_stream(self, path: str, query: Mapping[str, Any], *, read_seconds: float) -> urllib3.HTTPResponse:
        """A GET whose body the caller reads as it arrives (a watch), on connections of its own: a long watch must
        not hold one of the pool the converge passes share. Raises ApiError on any non-2xx answer."""
        with self._lock:
            if self._streams is None:
                cfg = copy.copy(self.cfg)  # shares the credentials, and their refresh, with the passes' client
                cfg.connection_pool_maxsize = STREAM_CONNECTIONS
                self._streams = k8s.ApiClient(cfg)
                self._streams.user_agent = USER_AGENT
            api = self._streams
        _, url, headers, _, _ = api.param_serialize("GET", path, query_params=list(query.items()),
                                                    header_params={"Accept": JSON}, auth_settings=["BearerToken"])
        try:
            raw = api.call_api("GET", url, header_params=headers, _request_timeout=(TIMEOUT[0], read_seconds)).response
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "Unreachable", _cause(exc), "GET", path) from None
        except k8s.ApiException as exc:
            raise ApiError(exc.status or 0, exc.reason or "Error", str(exc.body or ""), "GET", path) from None
        if not 200 <= raw.status < 300:
            try:
                data = raw.data
            finally:
                raw.release_conn()
            raise _refusal(raw.status, raw.reason, data, "GET", path)
        return cast(urllib3.HTTPResponse, raw)

    # -- discovery ------------------------------------------------------------------------------------------

    def discover(self, api_version: str) -> dict[str, Resource] | None:
        """Kind -> Resource for one apiVersion, or None when the server does not serve it (a missing CRD).
        Positive answers are cached for the process; a missing group is asked again next time."""
        with self._lock:
            if api_version in self._discovery:
                return self._discovery[api_version]
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            doc = self.request("GET", path, verb="DISCOVER")
        except ApiError as exc:
            if exc.not_found or exc.status == 503:
                return None
            raise
        found = {r["kind"]: Resource(api_version, r["kind"], r["name"], bool(r.get("namespaced")))
                 for r in doc.get("resources", []) if "/" not in r["name"]}
        with self._lock:
            self._discovery[api_version] = found
        return found

    def cached(self, api_version: str) -> dict[str, Resource] | None:
        """What discovery already found for one apiVersion, without asking: None when it has not been asked (or
        was not served)."""
        with self._lock:
            return self._discovery.get(api_version)

    def resource(self, api_version: str, kind: str) -> Resource | None:
        kinds = self.discover(api_version)
        return None if kinds is None else kinds.get(kind)

    # -- objects --------------------------------------------------------------------------------------------

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", res.path(namespace, name))
        return found

    def apply(self, res: Resource, obj: dict[str, Any], *, dry_run: bool = False,
              metadata_only: bool = False) -> dict[str, Any]:
        """Server-side apply of `obj` under the operator's field manager, taking over conflicting fields; with
        `dry_run`, validated and admitted by the API server but not stored. The answer is the object as stored,
        or with `metadata_only` its metadata (METADATA_ONLY)."""
        meta = obj["metadata"]
        query = {"fieldManager": FIELD_MANAGER, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        applied: dict[str, Any] = self.request(
            "PATCH", res.path(meta.get("namespace"), meta["name"]), query=query, body=obj, content_type=APPLY,
            verb="APPLY", accept=METADATA_ONLY if metadata_only else JSON)
        return applied

    def merge_patch(self, res: Resource, namespace: str | None, name: str, patch: dict[str, Any],
                    subresource: str | None = None, *, metadata_only: bool = False) -> dict[str, Any]:
        patched: dict[str, Any] = self.request("PATCH", res.path(namespace, name, subresource),
                                               query={"fieldManager": FIELD_MANAGER}, body=patch, content_type=MERGE,
                                               accept=METADATA_ONLY if metadata_only else JSON)
        return patched

    def delete(self, res: Resource, namespace: str | None, name: str, uid: str) -> None:
        """Delete one object, but only the one with this uid (never a namesake created since)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                "preconditions": {"uid": uid}}
        try:
            self.request("DELETE", res.path(namespace, name), body=body, content_type="application/json")
        except ApiError as exc:
            if not (exc.not_found or exc.conflict):  # gone already, or a different object now
                raise

    def create_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on `involved` (a SpecServing body), as `kubectl describe` shows them."""
        meta = involved["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"],
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER, "host": socket.gethostname()},
            "reportingComponent": f"specserving.io/{FIELD_MANAGER}", "reportingInstance": socket.gethostname(),
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self.request("POST", f"/api/v1/namespaces/{urllib.parse.quote(meta['namespace'])}/events", body=event,
                     content_type="application/json")

    # -- for kopf -------------------------------------------------------------------------------------------

    def connection(self) -> dict[str, Any]:
        """The same credentials, in the fields of kopf.ConnectionInfo."""
        header = self.cfg.get_api_key_with_prefix("BearerToken") or self.cfg.get_api_key_with_prefix(
            "authorization")
        parts = header.split(" ", 1) if header else []
        scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        return {"server": self.cfg.host, "ca_path": self.cfg.ssl_ca_cert, "insecure": not self.cfg.verify_ssl,
                "username": self.cfg.username or None, "password": self.cfg.password or None, "scheme": scheme,
                "token": token, "certificate_path": self.cfg.cert_file, "private_key_path": self.cfg.key_file}
