"""Names of the objects a SpecServing owns, and the longest SpecServing name that keeps them all valid.

Children are named `<SpecServing name>-<suffix>`; the prefill and decode workloads add the PD-contract revision,
`<SpecServing name>-<role>-<revision>` (docs/rollouts.md). Services and label values must be DNS labels of at most
63 characters, and a LeaderWorkerSet adds `-<group>-<worker>` to its pod names, so the suffixes set a cap on the
SpecServing's own name. The CRD enforces the cap with a CEL rule generated from these constants.
"""

from __future__ import annotations

# The pools' roles: the values of the role label, and what SpecServingSpec.pool takes.
PREFILL, DECODE, ROUTER = "prefill", "decode", "router"

DNS_LABEL_MAX = 63
PREFILL_SUFFIX = "prefill"
DECODE_SUFFIX = "decode"
ROUTER_SUFFIX = "router"
CHILD_SUFFIXES = (PREFILL_SUFFIX, DECODE_SUFFIX, ROUTER_SUFFIX)
# Room for a LeaderWorkerSet pod's "-<group index>-<worker index>" (up to 3 and 2 digits).
INDEX_ROOM = len("-999-99")
# The PD-contract revision: hex digits of a hash (rendering/contract.py).
REVISION_LENGTH = 8
MAX_NAME_LENGTH = DNS_LABEL_MAX - max(len(s) for s in CHILD_SUFFIXES) - 1 - (1 + REVISION_LENGTH) - INDEX_ROOM


def child_name(owner: str, suffix: str) -> str:
    """The name of the child `suffix` of the SpecServing `owner`."""
    return f"{owner}-{suffix}"


def workload_name(owner: str, role: str, revision: str) -> str:
    """The Deployment or LeaderWorkerSet of one pool at one PD-contract revision. The empty revision names the
    workloads of operators before revisions existed, which the first rollout replaces."""
    return f"{owner}-{role}-{revision}" if revision else child_name(owner, role)
