"""The build context of images/sglang-pd: its files, and the content hash that versions the fix.

The hash of every file's path and bytes is the fix's version: any change to the Dockerfile, the fix or the probe
gives new image tags and new build Jobs, and an unchanged context never builds twice.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "SPECSERVING_BUILD_CONTEXT"
# The image layout: the operator image copies images/sglang-pd here.
INSTALLED = Path("/opt/specserving/sglang-pd")
SKIP_DIRS = {"__pycache__", ".pytest_cache", "build", "dist"}
SKIP_SUFFIXES = (".pyc", ".egg-info")
MAX_BYTES = 512 * 1024  # well under a ConfigMap's 1 MiB


class ContextError(Exception):
    """The build context cannot be found or does not fit in a ConfigMap."""


@dataclass(frozen=True)
class BuildContext:
    """The files of the build context (relative path -> text) and their content hash."""

    files: dict[str, str]
    digest: str

    @property
    def fix_version(self) -> str:
        return self.digest[:16]


def default_directory() -> Path:
    """Where the context lives: $SPECSERVING_BUILD_CONTEXT, the operator image's copy, or this checkout's."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    if INSTALLED.is_dir():
        return INSTALLED
    return Path(__file__).resolve().parents[3] / "images" / "sglang-pd"


def load(directory: Path | None = None) -> BuildContext:
    """Read every file of the context directory."""
    root = directory or default_directory()
    if not (root / "Dockerfile").is_file():
        raise ContextError(f"no Dockerfile in the build context {root}; set {ENV_VAR}")
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or SKIP_DIRS & set(rel.parts) or any(p.endswith(SKIP_SUFFIXES) for p in rel.parts):
            continue
        files[rel.as_posix()] = path.read_text(encoding="utf-8")
    size = sum(len(v.encode()) for v in files.values())
    if size > MAX_BYTES:
        raise ContextError(f"the build context {root} is {size} bytes; a ConfigMap holds at most {MAX_BYTES}")
    h = hashlib.sha256()
    for name, text in files.items():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return BuildContext(files=files, digest=h.hexdigest())
