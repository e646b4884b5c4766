"""The local registry (hack/node.sh serves it on the real node's bridge address) as the cluster tests use it: its
HTTP API, moving a tag to another image, and the images hack/images.sh builds and pushes there."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest

from .conftest import IMAGE_TIMEOUT
from .kube import REPO, Cluster

LOCAL_REGISTRY = "10.88.0.1:5000"
MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


def api(method: str, path: str, body: bytes | None = None, content_type: str | None = None,
        ) -> tuple[int, dict[str, str], bytes]:
    """One request to /v2/<path>: (status, headers, body); HTTP errors are answers too."""
    headers = {"Accept": MANIFEST_TYPES, **({"Content-Type": content_type} if content_type else {})}
    req = urllib.request.Request(f"http://{LOCAL_REGISTRY}/v2/{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def repository_of(ref: str) -> str:
    """LOCAL_REGISTRY/repo:tag@digest -> repo."""
    return ref.split("@")[0][len(LOCAL_REGISTRY) + 1:].rsplit(":", 1)[0]


def point_tag(image: str, repo: str, tag: str) -> str:
    """Make LOCAL_REGISTRY/repo:tag point at `image` (LOCAL_REGISTRY/other...@sha256:...): mount its blobs into
    `repo` (a no-op within one repository) and put its manifest under `tag`. Returns the manifest's digest."""
    source, digest = image.split("@")[0], image.split("@")[1]
    source_repo = repository_of(source)
    code, headers, manifest = api("GET", f"{source_repo}/manifests/{digest}")
    assert code == 200, f"GET {image}: HTTP {code}"
    doc = json.loads(manifest)
    if source_repo != repo:
        for blob in [doc["config"], *doc["layers"]]:
            code, _, body = api("POST", f"{repo}/blobs/uploads/?mount={blob['digest']}&from={source_repo}")
            assert code == 201, f"mount {blob['digest']} into {repo}: HTTP {code} {body[:200]!r}"
    code, _, body = api("PUT", f"{repo}/manifests/{tag}", manifest, headers.get("Content-Type") or doc["mediaType"])
    assert code == 201, f"PUT {repo}:{tag}: HTTP {code} {body[:200]!r}"
    return digest


def local_image(cluster: Cluster, *args: str) -> str:
    """hack/images.sh ARGS (built once, then cached by content): LOCAL_REGISTRY/repo:tag@sha256:..."""
    proc = subprocess.run(["bash", str(REPO / "hack" / "images.sh"), *args], env=cluster.env, text=True,
                          capture_output=True, timeout=IMAGE_TIMEOUT, check=False)
    if proc.returncode != 0:
        pytest.fail(f"hack/images.sh {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]
