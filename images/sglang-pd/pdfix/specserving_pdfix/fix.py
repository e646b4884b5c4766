"""Applies the decode-path fix to the SGLang installed beside it, patching only what that release lacks.

Each patch first looks at the release's own code and is applied only where the upstream fix is absent,
so a release that already has it is left exactly as shipped:

- `pd_builder`: `SpeculativeAlgorithm.build_disagg_draft_input` gets a DFLASH / DSPARK branch (failure
  points 1 and 3) when the release's dispatcher does not import that algorithm's
  `sglang.srt.speculative.<alg>_disaggregation` module. The check reads the names the dispatcher's
  bytecode imports, so 0.5.18-0.5.19 (which ship `dflash_disaggregation` but never call it) count as
  missing, and 0.5.20+ as present. The wrapper forwards every other algorithm to the original method.
- `idle_draft_metadata` (0.5.16): the hand-built IDLE draft `ForwardBatch` of DSPARK under DP attention
  gets `original_global_num_tokens_cpu` (failure point 2), when `_fill_dp_moe_sync_metadata` never sets it.
- `decode_guard`: `ScheduleBatch.prepare_for_decode` on a DFLASH-family batch whose `spec_info` is None
  (failure point 4: an IDLE batch under DP attention never passes through the PD builder). An empty batch
  gets the release's idle draft input; a non-empty one raises a RuntimeError that names the cause instead
  of `'NoneType' object has no attribute 'prepare_for_decode'`. No release guards this, so it applies to
  every release that has a DFLASH-family algorithm.

`apply()` is idempotent and returns what it did; `state()` reports it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import Any, Callable

from specserving_pdfix import builders

logger = logging.getLogger("specserving_pdfix")

#: The algorithms this fix can build a PD-decode draft input for.
FIXABLE = ("DFLASH", "DSPARK")
#: Marks every function this package installs, so a second apply() (or a probe) can recognise it.
MARKER = "__specserving_pdfix__"

_state: dict[str, Any] = {"applied": False, "patches": {}}


def _imports_module(func: Any, module: str) -> bool:
    """Whether `func`'s own bytecode imports `module` (a function-local `from module import ...`)."""
    code = getattr(func, "__code__", None)
    return code is not None and module in code.co_names


def _stores_attribute(func: Any, attr: str) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and attr in code.co_names


def _mark(wrapper: Callable[..., Any], original: Callable[..., Any], patch: str) -> Callable[..., Any]:
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, MARKER, patch)
    return wrapper


def is_ours(func: Any) -> bool:
    return getattr(func, MARKER, None) is not None


def _algorithm_enum() -> Any:
    return importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm


def missing_pd_builders() -> list[str]:
    """DFLASH-family algorithms in this release's enum whose dispatcher branch is missing."""
    alg = _algorithm_enum()
    dispatch = inspect.getattr_static(alg, "build_disagg_draft_input")
    if is_ours(dispatch):
        dispatch = dispatch.__wrapped__
    return sorted(
        name
        for name in FIXABLE
        if name in alg.__members__
        and not _imports_module(dispatch, f"sglang.srt.speculative.{name.lower()}_disaggregation")
    )


def _patch_pd_builder() -> dict[str, Any] | None:
    alg = _algorithm_enum()
    original = inspect.getattr_static(alg, "build_disagg_draft_input")
    if is_ours(original):
        return _state["patches"].get("pd_builder")
    missing = frozenset(missing_pd_builders())
    if not missing:
        return None
    takes_server_args = "server_args" in inspect.signature(original).parameters

    if takes_server_args:  # 0.5.14 - 0.5.17

        def build_disagg_draft_input(self, batch, server_args, last_tokens_tensor, future_map):
            if self.name in missing:
                return builders.build_dflash_family_draft_input(batch, last_tokens_tensor, future_map)
            return original(self, batch, server_args, last_tokens_tensor, future_map)

    else:  # 0.5.18 and later

        def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):  # type: ignore[misc]
            if self.name in missing:
                return builders.build_dflash_family_draft_input(batch, last_tokens_tensor, future_map)
            return original(self, batch, last_tokens_tensor, future_map)

    alg.build_disagg_draft_input = _mark(build_disagg_draft_input, original, "pd_builder")
    return {"algorithms": sorted(missing), "signature": "with server_args" if takes_server_args else "without server_args"}


def _patch_idle_draft_metadata() -> dict[str, Any] | None:
    try:
        module = importlib.import_module("sglang.srt.speculative.dspark_components.dspark_draft")
    except ImportError:
        return None  # no DSPARK in this release
    patched = []
    for name, cls in sorted(vars(module).items()):
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        original = cls.__dict__.get("_fill_dp_moe_sync_metadata")
        if original is None or is_ours(original) or _stores_attribute(original, "original_global_num_tokens_cpu"):
            continue

        def _fill_dp_moe_sync_metadata(self, forward_batch, batch, _original=original):
            _original(self, forward_batch, batch)
            # Mirror ForwardBatch.init_new: a hand-built draft batch (the IDLE participation batch
            # under DP attention) otherwise leaves this None, and can_run_graph takes max() of it.
            if (
                getattr(self, "_dp_moe_sync", False)
                and batch.global_num_tokens is not None
                and getattr(forward_batch, "original_global_num_tokens_cpu", None) is None
            ):
                forward_batch.original_global_num_tokens_cpu = batch.global_num_tokens

        cls._fill_dp_moe_sync_metadata = _mark(_fill_dp_moe_sync_metadata, original, "idle_draft_metadata")
        patched.append(f"{module.__name__}.{name}._fill_dp_moe_sync_metadata")
    return {"targets": patched} if patched else None


def _idle_draft_input(batch: Any) -> Any:
    cls = importlib.import_module("sglang.srt.speculative.dflash_info_v2").DFlashDraftInputV2
    create = getattr(cls, "create_idle_input", None)
    if create is not None:
        return create(device=batch.device)
    import torch

    empty = torch.empty((0,), dtype=torch.int64, device=batch.device)
    return builders.seed_draft_input(empty, empty)


def _patch_decode_guard() -> dict[str, Any] | None:
    alg = _algorithm_enum()
    family = sorted(set(FIXABLE) & set(alg.__members__))
    if not family:
        return None
    sb = importlib.import_module("sglang.srt.managers.schedule_batch").ScheduleBatch
    original = sb.__dict__.get("prepare_for_decode")
    if original is None:
        return None
    if is_ours(original):
        return _state["patches"].get("decode_guard")
    family_set = frozenset(family)

    def prepare_for_decode(self, *args, **kwargs):
        algorithm = getattr(self, "spec_algorithm", None)
        if self.spec_info is None and getattr(algorithm, "name", None) in family_set:
            if len(self.reqs) == 0:
                # An IDLE batch (DP attention, this rank has no requests) never went through the PD
                # builder; give it the empty draft input the worker would have created.
                self.spec_info = _idle_draft_input(self)
            else:
                raise RuntimeError(
                    f"{algorithm.name} decode batch of {len(self.reqs)} request(s) reached prepare_for_decode "
                    "without a draft input: the PD-decode draft-input builder for this algorithm did not run "
                    "(see specserving docs/decode-path.md)"
                )
        return original(self, *args, **kwargs)

    sb.prepare_for_decode = _mark(prepare_for_decode, original, "decode_guard")
    return {"algorithms": family, "target": "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"}


def apply() -> dict[str, Any]:
    """Install every patch this release needs. Safe to call more than once."""
    if not _state["applied"]:
        patches: dict[str, Any] = {}
        for name, patch in (
            ("pd_builder", _patch_pd_builder),
            ("idle_draft_metadata", _patch_idle_draft_metadata),
            ("decode_guard", _patch_decode_guard),
        ):
            result = patch()
            if result is not None:
                patches[name] = result
        _state["patches"] = patches
        _state["applied"] = True
        logger.info("specserving decode-path fix applied: %s", patches or "nothing needed")
    return state()


def state() -> dict[str, Any]:
    return {"applied": _state["applied"], "patches": dict(_state["patches"])}
