"""What a tag points to now: the manifest digest of an image reference, read from its registry (OCI distribution
API), with the pull secret's credentials where one is given.

Used to key builds by the base image's content: a tag that moved builds again, one digest under two tags builds
once. Only a HEAD request for the manifest is made (a GET where the registry does not return the digest header);
no layer is read. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from specserving.imagebuild.planning import DIGEST

DOCKER_HUB = "docker.io"
# Docker Hub's API host; its references say docker.io (or nothing).
DOCKER_HUB_API = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
TIMEOUT_SECONDS = 10.0


class RegistryError(Exception):
    """The registry could not say what the reference points to (unreachable, unauthorised, no such tag)."""


@dataclass(frozen=True)
class Reference:
    """An image reference split the way registries see it."""

    host: str        # as written (docker.io for Docker Hub)
    repository: str  # library/ added for Docker Hub's official images
    tag: str
    digest: str | None = None

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.host == DOCKER_HUB else self.host


def parse(ref: str) -> Reference:
    """Split an image reference (Docker's normalisation: no host means docker.io, a one-part Hub name gets
    library/, no tag means latest)."""
    name, _, digest = ref.partition("@")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name
    head, _, last = path.rpartition("/")
    last, colon, tag = last.partition(":")
    path = f"{head}/{last}" if head else last
    if host == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path or not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", path):
        raise RegistryError(f"{ref!r} is not an image reference")
    return Reference(host=host, repository=path, tag=tag if colon else "latest", digest=digest or None)


Credentials = Mapping[str, tuple[str, str]]


def credentials_from_dockerconfig(documents: Iterable[bytes]) -> dict[str, tuple[str, str]]:
    """host -> (username, password) from kubernetes.io/dockerconfigjson documents (the first one naming a host
    wins, as for kubelet's pull secrets). Docker Hub's keys (https://index.docker.io/v1/) become docker.io."""
    out: dict[str, tuple[str, str]] = {}
    for doc in documents:
        try:
            auths = (json.loads(doc) or {}).get("auths") or {}
        except (ValueError, AttributeError):
            continue  # not a dockerconfigjson document: kubelet would not use it either
        for key, entry in auths.items():
            host = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
            if host in ("index.docker.io", DOCKER_HUB_API):
                host = DOCKER_HUB
            user, password = (entry or {}).get("username"), (entry or {}).get("password")
            if (not user or password is None) and (entry or {}).get("auth"):
                try:
                    user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    continue
            if user and host not in out:
                out[host] = (user, password or "")
    return out


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


def _basic(creds: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()


class Resolver:
    """Resolves tags to manifest digests. `insecure` hosts are spoken to over plain HTTP."""

    def __init__(self, insecure: Iterable[str] = (), timeout: float = TIMEOUT_SECONDS) -> None:
        self.insecure, self.timeout = frozenset(insecure), timeout

    def digest(self, ref: str, credentials: Credentials | None = None) -> str:
        """The manifest digest (sha256:...) `ref` points to now; a reference that pins one returns it."""
        r = parse(ref)
        if r.digest:
            if not DIGEST.fullmatch(r.digest):
                raise RegistryError(f"{ref!r} pins a digest that is not sha256:<64 hex>")
            return r.digest
        scheme = "http" if r.host in self.insecure else "https"
        url = f"{scheme}://{r.api_host}/v2/{r.repository}/manifests/{urllib.parse.quote(r.tag)}"
        creds = (credentials or {}).get(r.host)
        auth: str | None = None
        for attempt in range(2):
            try:
                return self._digest_of(url, auth)
            except urllib.error.HTTPError as exc:
                if exc.code != 401 or attempt or not exc.headers.get("WWW-Authenticate"):
                    raise RegistryError(self._why(ref, exc, creds)) from None
                auth = self._authorise(exc.headers["WWW-Authenticate"], r, creds)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"cannot reach the registry of {ref} at {scheme}://{r.api_host}: {reason}") from None
        raise AssertionError("unreachable")

    def _digest_of(self, url: str, auth: str | None) -> str:
        headers = {"Accept": MANIFEST_TYPES}
        if auth:
            headers["Authorization"] = auth
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method="HEAD"),
                                    timeout=self.timeout) as resp:
            found = str(resp.headers.get("Docker-Content-Digest") or "")
        if DIGEST.fullmatch(found):
            return found
        # The header is optional: the digest is the hash of the manifest's bytes as served.
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.timeout) as resp:
            return "sha256:" + hashlib.sha256(resp.read()).hexdigest()

    def _authorise(self, header: str, r: Reference, creds: tuple[str, str] | None) -> str:
        scheme, params = _challenge(header)
        if scheme == "basic":
            if creds is None:
                raise RegistryError(f"the registry {r.host} asks for credentials and no pull secret gives any")
            return _basic(creds)
        if scheme != "bearer" or "realm" not in params:
            raise RegistryError(f"the registry {r.host} asks for an authentication scheme this operator does not "
                                f"speak: {header}")
        query = {"scope": params.get("scope") or f"repository:{r.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": _basic(creds)} if creds else {}
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.timeout) as resp:
                body = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"the token service of {r.host} refused: HTTP {exc.code}"
                                + ("" if creds else " (no pull secret gives credentials for it)")) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"cannot get a token for {r.host} from {params['realm']}: "
                                f"{getattr(exc, 'reason', exc)}") from None
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RegistryError(f"the token service of {r.host} returned no token")
        return f"Bearer {token}"

    @staticmethod
    def _why(ref: str, exc: urllib.error.HTTPError, creds: tuple[str, str] | None) -> str:
        if exc.code == 404:
            return f"the registry has no manifest for {ref} (HTTP 404): check the tag"
        if exc.code in (401, 403):
            hint = "" if creds else "; set spec.image.pullSecrets to a Secret with credentials for it"
            return f"the registry refused to show {ref} (HTTP {exc.code}){hint}"
        return f"the registry answered HTTP {exc.code} for {ref}"
