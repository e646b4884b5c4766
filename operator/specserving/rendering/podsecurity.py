"""Which Pod Security Standards level a rendered pod needs: privileged, baseline or restricted.

The checks are the ones the standards define for the fields our pods can carry (kubernetes.io/docs/concepts/
security/pod-security-standards, policy version 1.25 and later), written out here; the cluster tier proves this
table against the API server's own PodSecurity admission (tests/cluster/test_pod_security.py). Used for the
`Degraded` message when a namespace's level refuses the pods, and for docs/security.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (RESTRICTED, BASELINE, PRIVILEGED)  # strictest first
# Capabilities baseline lets a container add.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# Volume kinds restricted allows.
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})


def _containers(pod: dict[str, Any]) -> Iterable[dict[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def _baseline_violations(pod: dict[str, Any]) -> list[str]:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    found += [f"hostPath volume {v.get('name')!r}" for v in pod.get("volumes") or [] if "hostPath" in v]
    for c in _containers(pod):
        sc = c.get("securityContext") or {}
        if any(p.get("hostPort") for p in c.get("ports") or []):
            found.append(f"hostPort on container {c.get('name')!r}")
        if sc.get("privileged"):
            found.append(f"privileged container {c.get('name')!r}")
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            found.append(f"capabilities {', '.join(sorted(added))} added to container {c.get('name')!r}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"unconfined seccomp on container {c.get('name')!r}")
    if ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("unconfined seccomp")
    return found


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    found = [f"{next(iter(k for k in v if k != 'name'), '?')} volume {v.get('name')!r}" for v in pod.get("volumes") or []
             if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod_sc = pod.get("securityContext") or {}
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for c in _containers(pod):
        sc, name = c.get("securityContext") or {}, c.get("name")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name!r} does not set allowPrivilegeEscalation=false")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            found.append(f"container {name!r} does not set runAsNonRoot=true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"container {name!r} runs as user 0")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"container {name!r} does not drop ALL capabilities")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"container {name!r} adds capabilities")
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            found.append(f"container {name!r} has no RuntimeDefault or Localhost seccomp profile")
    return found


def required_level(pod: dict[str, Any]) -> tuple[str, list[str]]:
    """The least privileged level that admits the pod spec `pod`, and what keeps it from the next stricter one."""
    baseline = _baseline_violations(pod)
    if baseline:
        return PRIVILEGED, baseline
    restricted = _restricted_violations(pod)
    if restricted:
        return BASELINE, restricted
    return RESTRICTED, []


def admits(level: str, needed: str) -> bool:
    """Whether a namespace enforcing `level` admits a pod that needs `needed`."""
    return LEVELS.index(level) >= LEVELS.index(needed)
