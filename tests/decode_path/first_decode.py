"""The first decode step of a PD decode node, run on one SGLang release's own code, on CPU.

    python first_decode.py        (in a decode_path interpreter, with specserving_pdfix importable)

This is the path that crashed in the field. Two requests arrive prefilled (their KV "transferred" into the pool,
their first token sampled by the prefill node); the decode scheduler builds the batch and takes its first step.
Everything below is SGLang's own code:

    Req, ReqToTokenPool, TokenToKVPoolAllocator, ChunkCache, FutureMap    real classes, small CPU sizes
    ScheduleBatch.init_new -> prepare_for_prebuilt -> process_prebuilt   the decode loop's prebuilt batch
      (the last one asks SpeculativeAlgorithm.build_disagg_draft_input for the draft input: the seeding)
    ScheduleBatch.prepare_for_decode -> <draft input>.prepare_for_decode the step that crashed
    FutureMap.resolve_seq_lens_cpu, resolve_forward_inputs               under overlap: the relay a forward reads

The releases' Triton kernels (the req_to_token writes) run on CPU tensors in Triton's own interpreter
(TRITON_INTERPRET=1). Stand-ins, each for something that exists only with a GPU server process:
- STAND-IN server arguments: a real `ServerArgs` object holding the dataclass defaults plus the speculative
  settings, published with the release's own setter, but built without `__post_init__` (which asks for an
  accelerator and a model config on disk).
- STAND-IN model config: the fields the batch reads (`vocab_size`, `is_encoder_decoder`, ...).
- STAND-IN KV cache behind the allocator: none. The allocator hands out slot numbers; no KV tensor exists, and
  the prefill's KV "transfer" is the slots written into each request's req_to_token row.
- STAND-IN `torch.Tensor.record_stream` for CPU tensors: a no-op (CUDA stream bookkeeping; torch refuses it on
  CPU).
What this cannot show: a forward pass, attention over real KV, CUDA graphs, or the draft model's tokens.

Each scenario is run once as shipped (no plugin loaded) and once after `sglang.srt.plugins.load_plugins()` has
run this project's entry point, in that order. Output: one JSON document on stdout.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import sys
import traceback
from array import array
from importlib import metadata
from types import SimpleNamespace
from typing import Any

# Triton's interpreter runs the releases' Triton kernels (the req_to_token writes) on CPU tensors; it must be set
# before triton is imported. No plan stream: that is a CUDA side stream.
os.environ["TRITON_INTERPRET"] = "1"
os.environ["SGLANG_ENABLE_OVERLAP_PLAN_STREAM"] = "0"

import torch  # noqa: E402

PROMPTS = ([11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26, 27])
BONUS = (101, 102)  # the first token of each request, sampled by the prefill node
BLOCK = 4  # --speculative-num-draft-tokens: the DFLASH family's verify block
POOL_REQS, CONTEXT, KV_SLOTS = 8, 64, 256
DEVICE = "cpu"


def sglang(module: str) -> Any:
    return importlib.import_module(f"sglang.srt.{module}")


def fields_of(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def call_with(func: Any, **available: Any) -> Any:
    """Call `func` with the arguments it declares, taken by name from `available` (signatures drift between
    releases: a parameter appears, another goes)."""
    params = inspect.signature(func).parameters
    return func(**{name: value for name, value in available.items() if name in params})


# ---- stand-ins and real pools -------------------------------------------------------------------------


def publish_server_args(algorithm: str, overlap: bool) -> Any:
    """STAND-IN server arguments, published with the release's own setter.

    Up to 0.5.18, constructing `ServerArgs` resolves it (`__post_init__` asks for an accelerator and reads the
    model's config), so the record is built without `__post_init__`: the dataclass defaults plus our settings.
    From 0.5.19, construction leaves the record raw and publishing resolves it (`resolve_once`, the same
    accelerator and model questions); that resolution is skipped for the publish."""
    server_args_mod = sglang("server_args")
    cls = server_args_mod.ServerArgs
    settings = dict(model_path="/stand-in/model", device=DEVICE, disaggregation_mode="decode",
                    speculative_algorithm=algorithm, speculative_num_draft_tokens=BLOCK,
                    speculative_num_steps=BLOCK - 1, speculative_eagle_topk=1, page_size=1,
                    disable_overlap_schedule=not overlap, tp_size=1, dp_size=1)
    resolves_on_publish = hasattr(cls, "resolve_once")
    if resolves_on_publish:
        args = cls(**settings)
    else:
        args = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                setattr(args, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(args, f.name, f.default_factory())
        for name, value in settings.items():
            setattr(args, name, value)
    setter = getattr(server_args_mod, "set_global_server_args_for_scheduler", None)
    if setter is None:
        setter = sglang("runtime_context").set_global_server_args_for_scheduler
    if not resolves_on_publish:
        setter(args)
        return args
    resolve_once = cls.resolve_once
    cls.resolve_once = lambda self: None
    try:
        setter(args)
    finally:
        cls.resolve_once = resolve_once
    return args


def make_tree_cache(req_to_token_pool: Any, allocator: Any) -> Any:
    """The cache a PD decode server runs with (radix cache disabled): ChunkCache up to 0.5.21; from 0.5.22 a
    disabled UnifiedRadixCache with only the full-attention component, as `mem_cache.registry` builds it."""
    params = call_with(sglang("mem_cache.cache_init_params").CacheInitParams, disable=True,
                       req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=allocator, page_size=1)
    if importlib.util.find_spec("sglang.srt.mem_cache.chunk_cache") is not None:
        return sglang("mem_cache.chunk_cache").ChunkCache(params)
    params.tree_components = (sglang("mem_cache.unified_cache.components").ComponentType.FULL,)
    return sglang("mem_cache.unified_radix_cache").UnifiedRadixCache(params)


def make_future_map(algorithm: Any, req_to_token_pool: Any) -> Any:
    return call_with(sglang("managers.overlap_utils").FutureMap, device=torch.device(DEVICE), spec_algo=algorithm,
                     req_to_token_pool=req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)


def prefilled_request(index: int, req_to_token_pool: Any, allocator: Any) -> tuple[Any, list[int]]:
    """A request as the PD decode prealloc and the KV transfer leave it: its prompt's KV slots allocated and
    written into its req_to_token row, the prefill's first token in output_ids."""
    schedule_batch = sglang("managers.schedule_batch")
    sampling = sglang("sampling.sampling_params").SamplingParams(max_new_tokens=16, top_k=1)
    sampling.normalize(None)
    req = call_with(schedule_batch.Req, rid=f"first-decode-{index}", origin_input_text="",
                    origin_input_ids=array("q", PROMPTS[index]), sampling_params=sampling, vocab_size=256)
    req.output_ids.append(BONUS[index])
    fill_len = len(PROMPTS[index])
    indices = req_to_token_pool.alloc([req])
    assert indices, "the stand-in req_to_token pool is full"
    if getattr(req, "req_pool_idx", None) is None:
        req.req_pool_idx = indices[0]
    slots = allocator.alloc(fill_len)
    req_to_token_pool.write((req.req_pool_idx, slice(0, fill_len)), slots)
    kv = getattr(req, "kv", None)
    if kv is None and hasattr(schedule_batch, "ReqKvInfo") and "kv" in vars(req):
        kv = req.kv = call_with(schedule_batch.ReqKvInfo, kv_allocated_len=0, swa_evicted_seqlen=0)
    # The lengths live on the request up to 0.5.15, then move into `req.kv` (allocated from 0.5.16, committed
    # from 0.5.19).
    for holder, field in ((req, "kv_committed_len"), (req, "kv_allocated_len"),
                          (kv, "kv_committed_len"), (kv, "kv_allocated_len")):
        if holder is not None and hasattr(holder, field):
            setattr(holder, field, fill_len)
    return req, [int(slot) for slot in slots]


def kv_length(req: Any, field: str) -> int:
    kv = getattr(req, "kv", None)
    return int(getattr(kv, field) if kv is not None and hasattr(kv, field) else getattr(req, field))


STAND_INS: list[str] = []


def install_stand_ins() -> None:
    """A tensor's `record_stream` is CUDA stream bookkeeping, which torch refuses for a CPU tensor: it becomes a
    no-op for CPU tensors, and nothing else changes."""
    record_stream = torch.Tensor.record_stream

    def record_stream_on_cpu_is_nothing(tensor: Any, stream: Any) -> None:
        if tensor.device.type != "cpu":
            record_stream(tensor, stream)

    torch.Tensor.record_stream = record_stream_on_cpu_is_nothing
    STAND_INS.append("torch.Tensor.record_stream: a no-op for CPU tensors")


# ---- the scenarios ------------------------------------------------------------------------------------


class Step:
    """One decode loop: the pools, the prefilled requests, the prebuilt batch."""

    def __init__(self, algorithm_name: str, overlap: bool, requests: int = 2) -> None:
        self.algorithm_name, self.overlap = algorithm_name, overlap
        self.algorithm = sglang("speculative.spec_info").SpeculativeAlgorithm[algorithm_name]
        self.server_args = publish_server_args(algorithm_name, overlap)
        self.req_to_token_pool = sglang("mem_cache.memory_pool").ReqToTokenPool(
            size=POOL_REQS, max_context_len=CONTEXT, device=DEVICE, enable_memory_saver=False)
        self.allocator = sglang("mem_cache.allocator").TokenToKVPoolAllocator(
            size=KV_SLOTS, dtype=torch.bfloat16, device=DEVICE, kvcache=None, need_sort=False)
        self.tree_cache = make_tree_cache(self.req_to_token_pool, self.allocator)
        self.future_map = make_future_map(self.algorithm, self.req_to_token_pool)
        prefilled = [prefilled_request(i, self.req_to_token_pool, self.allocator) for i in range(requests)]
        self.reqs = [req for req, _ in prefilled]
        self.prefill_slots = [slots for _, slots in prefilled]
        self.model_config = SimpleNamespace(vocab_size=256, is_encoder_decoder=False, is_multimodal=False,
                                            hf_config=SimpleNamespace(architectures=["StandInForCausalLM"]))

    def prebuilt_batch(self) -> Any:
        """What `get_new_prebuilt_batch` does with the requests the transfer finished."""
        for req in self.reqs:
            req.init_next_round_input(self.tree_cache)
            if hasattr(req, "set_extend_range"):
                req.set_extend_range(len(req.prefix_indices), kv_length(req, "kv_committed_len"))
            elif hasattr(req, "extend_end"):
                # From 0.5.22 the decode loop ends the extend range at the committed KV by hand: the rebuilt fill
                # ids include the prefill's first token, whose KV is not committed yet.
                req.extend_end = kv_length(req, "kv_committed_len")
        cls = sglang("managers.schedule_batch").ScheduleBatch
        batch = cls.init_new(self.reqs, self.req_to_token_pool, self.allocator, self.tree_cache,
                             self.model_config, self.overlap, self.algorithm)
        if not self.reqs:
            return batch
        batch.prepare_for_prebuilt()
        call_with(batch.process_prebuilt, server_args=self.server_args, future_map=self.future_map)
        return batch

    def decode(self, batch: Any) -> dict[str, Any]:
        """The first decode step's preparation, then (under overlap) the relay the forward reads."""
        free_before = self.allocator.available_size()
        out: dict[str, Any] = {"draftInput": None if batch.spec_info is None else type(batch.spec_info).__name__}
        try:
            batch.prepare_for_decode()
        except Exception as exc:
            return {**out, "prepared": False, **failure(exc)}
        rows = self.req_to_token_pool.req_to_token
        reserved = getattr(batch.spec_info, "reserved_seq_lens_cpu", None)
        out.update(
            prepared=True,
            forwardMode=batch.forward_mode.name,
            draftInputAfter=None if batch.spec_info is None else type(batch.spec_info).__name__,
            kvCommittedLen=[kv_length(r, "kv_committed_len") for r in self.reqs],
            kvAllocatedLen=[kv_length(r, "kv_allocated_len") for r in self.reqs],
            slotsTaken=free_before - self.allocator.available_size(),
            prefillSlots=self.prefill_slots,
            seqLensCpu=None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
            reservedSeqLens=None if reserved is None else reserved.tolist(),
            rows=[rows[r.req_pool_idx, :kv_length(r, "kv_allocated_len")].tolist() for r in self.reqs],
        )
        if self.overlap and self.reqs:
            try:
                self.future_map.resolve_seq_lens_cpu(batch)
                sglang("managers.overlap_utils").resolve_forward_inputs(batch, self.future_map)
            except Exception as exc:
                return {**out, "relayResolved": False, **failure(exc)}
            info = batch.spec_info
            tokens = getattr(info, "bonus_tokens", None)
            if tokens is None:
                tokens = getattr(info, "verified_id", None)
            out["relayResolved"] = True
            out["relay"] = {"seqLens": batch.seq_lens.tolist(), "seqLensCpu": batch.seq_lens_cpu.tolist(),
                            "bonusTokens": None if tokens is None else tokens.tolist(),
                            "futureIndices": None if info.future_indices is None else info.future_indices.tolist(),
                            "reqPoolIndices": [int(r.req_pool_idx) for r in self.reqs]}
        return out


def failure(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}", "raisedIn": traceback.extract_tb(exc.__traceback__)[-1].name,
            "traceback": traceback.format_exc(limit=-5)}


def scenarios(algorithms: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in algorithms:
        for overlap in (False, True):
            key = f"{name}/{'overlap' if overlap else 'plain'}"
            step = Step(name, overlap)
            try:
                batch = step.prebuilt_batch()
            except Exception as exc:
                found[key] = {"prebuilt": False, **failure(exc)}
                continue
            found[key] = {"prompts": [len(p) for p in PROMPTS], "block": BLOCK, **step.decode(batch)}
        # The field report: an IDLE (no requests) batch of the DFLASH family reaching prepare_for_decode.
        idle = Step(name, overlap=True, requests=0)
        found[f"{name}/idle"] = idle.decode(idle.prebuilt_batch())
        # A batch with requests whose draft input was never built (failure point 4 with requests).
        unseeded = Step(name, overlap=False)
        batch = unseeded.prebuilt_batch()
        batch.spec_info = None
        found[f"{name}/unseeded"] = unseeded.decode(batch)
    return found


def relay_removed(name: str) -> dict[str, Any]:
    """The fix with its overlap relay switched off (failure point 3): the seeded draft input has no
    future_indices, and the first overlapped step's relay has nothing to resolve with."""
    from specserving_pdfix import builders

    original = builders.seed_overlap_relay
    builders.seed_overlap_relay = lambda *args, **kwargs: None
    try:
        step = Step(name, overlap=True)
        return step.decode(step.prebuilt_batch())
    finally:
        builders.seed_overlap_relay = original


def main() -> int:
    install_stand_ins()
    algorithms = [a for a in ("DFLASH", "DSPARK")
                  if a in sglang("speculative.spec_info").SpeculativeAlgorithm.__members__]
    report: dict[str, Any] = {"sglang": metadata.version("sglang"), "algorithms": algorithms}
    report["upstream"] = scenarios(algorithms)
    sglang("plugins").load_plugins()
    from specserving_pdfix import fix

    state = fix.state()
    report["fix"] = {"applied": bool(state["applied"]), "patches": sorted(state["patches"])}
    report["withFix"] = scenarios(algorithms)
    ours = state["patches"].get("pd_builder", {}).get("algorithms", [])
    report["relayRemoved"] = {name: relay_removed(name) for name in algorithms if name in ours}
    report["standIns"] = STAND_INS
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
