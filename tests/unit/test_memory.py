"""The operator's memory: the periodic heap trim (real on glibc, absent elsewhere), what it imports, what it shares."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from specserving.reconcile import memory
from specserving.reconcile.observed import child_of, pod_of
from specserving.rendering import labels as L


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_malloc_trim_gives_freed_heap_memory_back() -> None:
    trim = memory.malloc_trim()
    assert trim is not None, "this machine's C library is glibc: malloc_trim must be found"
    # 64 MiB in blocks below glibc's mmap threshold (so on the heap), every other one kept: the freed half is in the
    # middle of the heap, where free() alone never returns it to the kernel.
    blocks = [bytearray(100_000) for _ in range(640)]
    kept = blocks[::2]
    del blocks
    before = _rss_kib()
    trim()
    after = _rss_kib()
    assert before - after > 8 * 1024, f"RSS {before} -> {after} KiB: the freed 32 MiB were not given back"
    assert len(kept) == 320


def test_without_malloc_trim_the_loop_says_so_and_ends(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(memory, "malloc_trim", lambda: None)
    with caplog.at_level(logging.INFO, logger="specserving.reconcile"):
        asyncio.run(asyncio.wait_for(memory.trim_every(0.01), timeout=5))
    assert "no malloc_trim" in caplog.text


def test_the_operator_does_not_load_the_cel_interpreter() -> None:
    # The API server runs the CRD's CEL rules before the webhook and the reconciler see an object; only the offline
    # `specserving validate` runs them again. celpy and its lark grammar would be start-up RSS kept for nothing.
    code = ("import sys, specserving.reconcile.runner, specserving.webhook.runtime, specserving.cli; "
            "print(sorted(m for m in ('celpy', 'lark') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_operator_on_certificate_files_does_not_load_cryptography() -> None:
    # The chart gives the webhook its certificate in files; only self mode (local clusters) makes one. cryptography
    # maps OpenSSL's bindings on import (8.8 MiB of RSS), which such an operator would keep for nothing.
    code = ("import sys, specserving.reconcile.runner, specserving.webhook.runtime, specserving.cli; "
            "print('cryptography' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"


def test_summaries_of_watched_objects_share_the_strings_they_have_in_common() -> None:
    # Each watch event is decoded afresh; the summaries kept of thousands of children and pods must not each hold
    # their own copy of a kind, a group, a role or an owner's uid.
    def deployment(name: str) -> dict[str, Any]:
        return json.loads(json.dumps({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                         "labels": {L.ROLE: "decode", L.REVISION: "6942fe8a"},
                         "ownerReferences": [{"uid": "owner-uid-1"}]},
            "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}))

    one, two = child_of(deployment("a-decode"), workload=True), child_of(deployment("b-decode"), workload=True)
    assert one.ref.group is two.ref.group and one.ref.kind is two.ref.kind and one.api_version is two.api_version
    assert one.owner_uids[0] is two.owner_uids[0]
    assert one.workload is not None and two.workload is not None
    assert one.workload.role is two.workload.role and one.workload.revision is two.workload.revision
    pods = [pod_of(json.loads(json.dumps({"metadata": {"name": n, "labels": {L.ROLE: "decode"}},
                                          "status": {"phase": "Running"}}))) for n in ("p1", "p2")]
    assert pods[0].role is pods[1].role and pods[0].phase is pods[1].phase
