"""PD-decode draft-input builders for the DFLASH family (DFLASH, DSPARK), written for SGLang releases
that ship the algorithm but not its disaggregated-decode builder.

On a PD decode node a request arrives already prefilled; its first decode step runs
`batch.spec_info.prepare_for_decode(batch)` before any local forward, so the speculative state that the
worker would otherwise create lazily has to be seeded from the handoff. For the DFLASH family that state
is small: the bonus token (the last token the prefill node sampled) and the sequence lengths. The draft
top-k and hidden states are recomputed every step, so they start empty.

Under the overlap scheduler the state is also relayed through the scheduler's `FutureMap`: the draft
input carries `future_indices` (one slot per request: its req-pool index), the new sequence lengths are
published there and the bonus tokens stashed there, exactly as a normal decode step leaves them.

Everything here adapts to the SGLang release at call time (field names, payload types), so one builder
serves 0.5.14 through 0.5.19. Nothing is imported from SGLang at module import time.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any


def _draft_input_class() -> type:
    return importlib.import_module("sglang.srt.speculative.dflash_info_v2").DFlashDraftInputV2


def _field_names(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set()


def seed_draft_input(bonus_tokens: Any, seq_lens: Any) -> Any:
    """A fresh `DFlashDraftInputV2` for a batch whose prefill happened elsewhere.

    `bonus_tokens` (one int64 token per request) and `seq_lens` are tensors on the batch's device.
    The top-k and hidden-state tensors are empty (`(bs, 0)`), because the DFLASH family regenerates
    them on every step. Releases before 0.5.15 call the bonus token `verified_id`.
    """
    import torch

    cls = _draft_input_class()
    fields = _field_names(cls)
    bs = int(seq_lens.numel())
    device = bonus_tokens.device
    kwargs: dict[str, Any] = {
        "topk_p": torch.empty((bs, 0), device=device, dtype=torch.float32),
        "topk_index": torch.empty((bs, 0), device=device, dtype=torch.int64),
        "new_seq_lens": seq_lens.to(dtype=torch.int64),
        "hidden_states": torch.empty((bs, 0), device=device, dtype=torch.float16),
    }
    token_field = "bonus_tokens" if "bonus_tokens" in fields or not fields else "verified_id"
    kwargs[token_field] = bonus_tokens.to(dtype=torch.int64)
    return cls(**kwargs)


def _relay_payload(draft_input: Any, bonus_tokens: Any) -> Any:
    """What `FutureMap.stash` takes in this release: a `RelayPayload` (0.5.15 and later) holding only
    the bonus tokens, or (0.5.14) the draft input itself."""
    overlap_utils = importlib.import_module("sglang.srt.managers.overlap_utils")
    payload_cls = getattr(overlap_utils, "RelayPayload", None)
    if payload_cls is None:
        return draft_input
    return payload_cls(bonus_tokens=bonus_tokens)


def seed_overlap_relay(batch: Any, draft_input: Any, bonus_tokens: Any, future_map: Any) -> None:
    """Give `draft_input` its relay slots and fill them, as a normal overlapped decode step would.

    Without `future_indices` the first overlapped step's relay resolution indexes with None
    (failure point 3 of the upstream fix).
    """
    draft_input.future_indices = batch.req_pool_indices
    if hasattr(draft_input, "future_dsa_topk_indices_available"):
        # No DSA top-k indices were relayed for this step; the draft recomputes them.
        draft_input.future_dsa_topk_indices_available = False
    future_map.publish(draft_input.future_indices, batch.seq_lens)
    future_map.stash(draft_input.future_indices, _relay_payload(draft_input, bonus_tokens))


def build_dflash_family_draft_input(batch: Any, last_tokens_tensor: Any, future_map: Any) -> Any:
    """The PD-decode draft input for DFLASH or DSPARK: seeded state plus, under overlap, the relay."""
    draft_input = seed_draft_input(last_tokens_tensor, batch.seq_lens)
    if getattr(batch, "enable_overlap", False):
        seed_overlap_relay(batch, draft_input, last_tokens_tensor, future_map)
    return draft_input
