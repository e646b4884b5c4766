"""Builds keyed by the base image's content: resolving a tag to its digest over the registry API (against a real
HTTP server speaking the distribution API's manifest and token endpoints), and the build keys that follow."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.imagebuild.planning import plan, repository
from specserving.registry import RegistryError, Resolver, credentials_from_dockerconfig, parse

from .builders import seed

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}).encode()
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
OTHER = "sha256:" + "1" * 64


class Registry(ThreadingHTTPServer):
    """A registry with one repository, ml/sglang, whose tags map to digests; auth: none, basic or bearer."""

    def __init__(self, auth: str = "none", send_digest_header: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.auth, self.send_digest_header = auth, send_digest_header
        self.tags = {"v0.5.16": DIGEST, "moved": DIGEST}
        self.user, self.password, self.token = "robot", "s3cret", "tok-123"
        self.requests: list[tuple[str, str, str | None]] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Registry

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorised(self) -> bool:
        srv, got = self.server, self.headers.get("Authorization")
        basic = "Basic " + base64.b64encode(f"{srv.user}:{srv.password}".encode()).decode()
        if srv.auth == "basic" and got != basic:
            self._send(401, headers={"WWW-Authenticate": 'Basic realm="registry"'})
            return False
        if srv.auth == "bearer" and got != f"Bearer {srv.token}":
            realm = f"http://{srv.host}/token"
            self._send(401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="test-registry",'
                                                         'scope="repository:ml/sglang:pull"'})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        srv = self.server
        srv.requests.append((self.command, self.path, self.headers.get("Authorization")))
        if self.path.startswith("/token"):
            basic = "Basic " + base64.b64encode(f"{srv.user}:{srv.password}".encode()).decode()
            if self.headers.get("Authorization") != basic or "service=test-registry" not in self.path:
                return self._send(401)
            return self._send(200, json.dumps({"token": srv.token}).encode())
        prefix = "/v2/ml/sglang/manifests/"
        if not self.path.startswith(prefix):
            return self._send(404)
        if not self._authorised():
            return None
        if "manifest.v1+json" not in (self.headers.get("Accept") or ""):
            return self._send(406)
        digest = srv.tags.get(self.path[len(prefix):])
        if digest is None:
            return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
        headers = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        if srv.send_digest_header:
            headers["Docker-Content-Digest"] = digest
        return self._send(200, MANIFEST, headers)

    do_HEAD = do_GET  # noqa: N815


@pytest.fixture
def registry(request: pytest.FixtureRequest) -> Iterator[Registry]:
    srv = Registry(*getattr(request, "param", ()))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _resolver(srv: Registry) -> Resolver:
    return Resolver(insecure=[srv.host], timeout=5)


@pytest.mark.parametrize(("ref", "host", "repo", "tag", "digest"), [
    ("lmsysorg/sglang:v0.5.16-cu129", "docker.io", "lmsysorg/sglang", "v0.5.16-cu129", None),
    ("python", "docker.io", "library/python", "latest", None),
    ("docker.io/library/python:3.11", "docker.io", "library/python", "3.11", None),
    ("10.88.0.1:5000/specserving/stand-in/sglang:v0.5.16-cpu-abc", "10.88.0.1:5000", "specserving/stand-in/sglang",
     "v0.5.16-cpu-abc", None),
    ("localhost/ml/x:1@" + OTHER, "localhost", "ml/x", "1", OTHER),
])
def test_references_split_as_docker_does(ref: str, host: str, repo: str, tag: str, digest: str | None) -> None:
    r = parse(ref)
    assert (r.host, r.repository, r.tag, r.digest) == (host, repo, tag, digest)


def test_a_tag_resolves_to_the_registrys_digest(registry: Registry) -> None:
    assert _resolver(registry).digest(f"{registry.host}/ml/sglang:v0.5.16") == DIGEST
    assert registry.requests[0][0] == "HEAD", "a HEAD request is enough when the registry sends the digest"


@pytest.mark.parametrize("registry", [("none", False)], indirect=True)
def test_without_the_digest_header_the_manifest_is_hashed(registry: Registry) -> None:
    assert _resolver(registry).digest(f"{registry.host}/ml/sglang:v0.5.16") == DIGEST


def test_a_pinned_reference_needs_no_request(registry: Registry) -> None:
    assert _resolver(registry).digest(f"{registry.host}/ml/sglang:v0.5.16@{OTHER}") == OTHER
    assert registry.requests == []


def test_an_unknown_tag_says_so(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="no manifest for .*HTTP 404.*check the tag"):
        _resolver(registry).digest(f"{registry.host}/ml/sglang:v9")


@pytest.mark.parametrize("registry", [("basic",)], indirect=True)
def test_basic_auth_uses_the_pull_secret(registry: Registry) -> None:
    ref = f"{registry.host}/ml/sglang:v0.5.16"
    with pytest.raises(RegistryError, match="no pull secret gives any"):
        _resolver(registry).digest(ref)
    creds = credentials_from_dockerconfig([_dockerconfig(registry.host, registry.user, registry.password)])
    assert _resolver(registry).digest(ref, creds) == DIGEST


@pytest.mark.parametrize("registry", [("bearer",)], indirect=True)
def test_bearer_tokens_are_fetched_with_the_pull_secret(registry: Registry) -> None:
    ref = f"{registry.host}/ml/sglang:v0.5.16"
    with pytest.raises(RegistryError, match="token service .* refused: HTTP 401 \\(no pull secret"):
        _resolver(registry).digest(ref)
    creds = credentials_from_dockerconfig([_dockerconfig(registry.host, registry.user, registry.password)])
    assert _resolver(registry).digest(ref, creds) == DIGEST
    token_requests = [r for r in registry.requests if r[1].startswith("/token")]
    assert token_requests and "scope=repository%3Aml%2Fsglang%3Apull" in token_requests[-1][1]


def test_an_unreachable_registry_is_an_error_not_a_hang() -> None:
    with pytest.raises(RegistryError, match="cannot reach the registry"):
        Resolver(insecure=["127.0.0.1:9"], timeout=2).digest("127.0.0.1:9/ml/sglang:v1")


def test_dockerconfig_credentials() -> None:
    hub = json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": base64.b64encode(b"u:p:w").decode()}}})
    local = _dockerconfig("registry.local:5000", "robot", "pw")
    creds = credentials_from_dockerconfig([hub.encode(), local, b"not json", _dockerconfig("docker.io", "x", "y")])
    assert creds == {"docker.io": ("u", "p:w"), "registry.local:5000": ("robot", "pw")}


def _dockerconfig(host: str, user: str, password: str) -> bytes:
    return json.dumps({"auths": {host: {"username": user, "password": password}}}).encode()


# -- build keys ---------------------------------------------------------------------------------------------------

def _plan(base: str) -> Any:
    return plan(spec_of(seed(**{"spec.image.base": base})), load(), fix_version="f1", default_registry="r.local/ml")


def test_one_digest_under_two_tags_is_one_build() -> None:
    a = _plan("r.local/ml/sglang:v0.5.16-a").pinned(DIGEST)
    b = _plan("r.local/ml/sglang:v0.5.16-b").pinned(DIGEST)
    assert a.build_key == b.build_key and a.target == b.target
    assert a.base_ref == f"r.local/ml/sglang@{DIGEST}"


def test_a_moved_tag_is_a_new_build() -> None:
    before = _plan("r.local/ml/sglang:v0.5.16").pinned(DIGEST)
    after = _plan("r.local/ml/sglang:v0.5.16").pinned(OTHER)
    assert before.build_key != after.build_key


def test_a_base_pinned_in_the_spec_is_keyed_by_its_digest() -> None:
    written = _plan(f"r.local/ml/sglang:v0.5.16@{DIGEST}")
    assert written.base_digest == DIGEST
    assert written.build_key == _plan("r.local/ml/sglang:v0.5.16-other").pinned(DIGEST).build_key


def test_unresolved_bases_keep_the_tag_key() -> None:
    p = _plan("r.local/ml/sglang:v0.5.16")
    assert p.base_digest is None and p.base_ref == "r.local/ml/sglang:v0.5.16"


@pytest.mark.parametrize(("ref", "repo"), [
    ("r.local:5000/ml/sglang:v1@" + OTHER, "r.local:5000/ml/sglang"),
    ("r.local:5000/sglang", "r.local:5000/sglang"),
    ("lmsysorg/sglang:v0.5.16", "lmsysorg/sglang"),
])
def test_repository_drops_tag_and_digest(ref: str, repo: str) -> None:
    assert repository(ref) == repo


def test_a_build_proves_one_algorithm_so_each_algorithm_has_its_own() -> None:
    dspark = _plan("r.local/ml/sglang:nightly").pinned(DIGEST)
    other = plan(spec_of(seed(**{"spec.image.base": "r.local/ml/sglang:nightly", "spec.speculative.algorithm": "EAGLE3"})),
                 load(), fix_version="f1", default_registry="r.local/ml").pinned(DIGEST)
    assert dspark.build_key != other.build_key
