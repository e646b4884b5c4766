"""The PD contract: every setting that must agree between a prefill pod and the decode pod it hands KV and draft
state to, and its revision (a hash of those settings).

Prefill and decode pods of one revision are paired by the router; pods of two revisions never are
(docs/rollouts.md). So a change to any field here starts a new revision, rolled out beside the old one, and a
change to anything else (replicas, one pool's resources, the router) updates the current revision in place.
Pure: the same spec and image always give the same revision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from specserving import argv
from specserving.api.naming import REVISION_LENGTH
from specserving.api.types import SpecServingSpec
from specserving.capabilities import CapabilityTable
from specserving.capabilities import load as load_capabilities
from specserving.rendering.image import ResolvedImage
from specserving.rendering.labels import DECODE, PREFILL


@dataclass(frozen=True)
class ContractField:
    """One entry of the contract, with why prefill and decode must agree on it (docs/rollouts.md prints these)."""

    path: str
    reason: str


FIELDS = (
    ContractField("image (resolved) and its SGLang version",
                  "the Mooncake/NIXL bootstrap handshake, the KV layout and the draft-state handoff are SGLang code; "
                  "two versions (or a fixed and an unfixed decode path) are not known to agree"),
    ContractField("spec.model", "both roles must load the same weights: the KV cache and the draft state a prefill "
                  "sends are only meaningful to a decode running the same model; servedModelName is how the "
                  "router groups workers"),
    ContractField("spec.engine.tp, spec.engine.dp, spec.engine.enableDpAttention, spec.engine.enableDpLmHead",
                  "the KV transfer maps prefill ranks to decode ranks: SGLang's bootstrap server records the "
                  "prefill's tp/dp layout and the decode computes its peers from it"),
    ContractField("spec.engine.port", "the router reaches every prefill and decode pod of a revision on one port "
                  "(--service-discovery-port)"),
    ContractField("spec.speculative, spec.prefill.speculativeDecoding",
                  "the prefill builds the first draft input (hidden states, top-k, bonus token) for the decode's "
                  "algorithm; an EAGLE3 prefill's state is not a DSPARK decode's"),
    ContractField("spec.transfer", "the backend, its devices and network decide whether two pods can reach each "
                  "other at all; a prefill on mooncake cannot hand KV to a decode on nixl"),
    ContractField("spec.prefill.nodesPerReplica, spec.decode.nodesPerReplica",
                  "a replica's node count changes its rank layout and its workload kind (Deployment or "
                  "LeaderWorkerSet)"),
    ContractField("extraArgs flags in CONTRACT_FLAGS, any --speculative-* or --disaggregation-* flag, and the "
                  "version's PD-symmetric flags",
                  "SGLang's handshake refuses mismatched --page-size and --kv-cache-dtype (and --dsv4-attn-backend "
                  "from 0.5.23); --context-length, --dtype, --quantization and --revision change what a KV page "
                  "holds"),
    ContractField("spec.engine.env entries named SGLANG_* or MC_*",
                  "SGLang and Mooncake read these on both roles; a pool's own env stays that pool's setting"),
)

# Flags of extraArgs that are part of the contract on every version, beyond the version's PD-symmetric list.
CONTRACT_FLAGS = frozenset({"--page-size", "--kv-cache-dtype", "--context-length", "--dtype", "--quantization",
                            "--revision", "--load-format", "--tokenizer-path"})
CONTRACT_FLAG_PREFIXES = ("--speculative-", "--disaggregation-")
CONTRACT_ENV_PREFIXES = ("SGLANG_", "MC_")


def _flag_values(args: Iterable[str], contract: frozenset[str], grammar: argv.Grammar) -> dict[str, list[str]]:
    """The contract flags among `args` with the tokens that follow each (up to the next flag). A flag is named as
    the version's parser resolves it, so an abbreviation (`--page-s 64`) counts as the flag it sets."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for token in args:
        name = argv.canonical(token, grammar)
        if name is not None:
            current = None
            if name in contract or name.startswith(CONTRACT_FLAG_PREFIXES):
                current = found.setdefault(name, [])
                if "=" in token:
                    current.append(token.split("=", 1)[1])
                    current = None
        elif current is not None:
            current.append(token)
    return found


def fields(spec: SpecServingSpec, image: ResolvedImage, table: CapabilityTable | None = None) -> dict[str, Any]:
    """The contract of `spec` on `image`, as field path -> value (JSON-serialisable, stable)."""
    table = table or load_capabilities()
    contract = CONTRACT_FLAGS | frozenset(table.symmetric_flags(image.sglang_version))
    grammar = argv.sglang(image.sglang_version)
    eng = spec.engine
    out: dict[str, Any] = {
        "image": image.ref,
        "image.sglangVersion": image.sglang_version,
        "image.fixApplied": image.fix_applied,
        "spec.model": asdict(spec.model),
        "spec.engine.tp": eng.tp,
        "spec.engine.dp": eng.dp,
        "spec.engine.enableDpAttention": eng.enable_dp_attention,
        "spec.engine.enableDpLmHead": eng.enable_dp_lm_head,
        "spec.engine.port": eng.port,
        "spec.speculative": asdict(spec.speculative),
        "spec.prefill.speculativeDecoding": spec.prefill.speculative_decoding,
        "spec.transfer": asdict(spec.transfer),
        "spec.prefill.nodesPerReplica": spec.prefill.nodes_per_replica,
        "spec.decode.nodesPerReplica": spec.decode.nodes_per_replica,
    }
    for role in (PREFILL, DECODE):
        args = [*(eng.extra_args or []), *(spec.pool(role).extra_args or [])]
        for flag, values in sorted(_flag_values(args, contract, grammar).items()):
            out[f"{role} {flag}"] = values
    env = [e for e in eng.env or [] if str(e.get("name", "")).startswith(CONTRACT_ENV_PREFIXES)]
    if env:
        out["spec.engine.env"] = sorted(env, key=lambda e: str(e.get("name")))
    return out


def revision_of(contract: dict[str, Any]) -> str:
    """The revision name: the first REVISION_LENGTH hex digits of the contract's SHA-256."""
    blob = json.dumps(contract, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:REVISION_LENGTH]


def revision(spec: SpecServingSpec, image: ResolvedImage, table: CapabilityTable | None = None) -> str:
    return revision_of(fields(spec, image, table))


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The contract entries whose values differ, sorted (what `specserving plan` names as the cause)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
