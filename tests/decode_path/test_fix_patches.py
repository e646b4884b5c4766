"""The fix's other patches, exercised on the real SGLang classes: failure point 2 (the IDLE draft batch's
`original_global_num_tokens_cpu`), failure point 4 (a DFLASH-family batch reaching `prepare_for_decode`
with no draft input), and idempotence."""

from __future__ import annotations

import pytest

from .conftest import VERSIONS, Runner, runs_for, script_run

pytestmark = pytest.mark.decode_path

# Builds the IDLE draft ForwardBatch exactly as DSPARK's run_idle_participation does (every DSPARK release), runs
# _fill_dp_moe_sync_metadata on it under DP-MoE sync, before and after the fix.
IDLE_METADATA = r"""
import inspect, json, torch
from types import SimpleNamespace
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.dspark_components import dspark_draft

# From 0.5.17 the method also asks the (uninitialised here) expert-parallel group whether to pad; answer no.
if hasattr(dspark_draft, "enable_num_token_non_padded"):
    dspark_draft.enable_num_token_non_padded = lambda: False

# Later releases add constructor arguments the IDLE metadata never reads (the TP sync, the draft sampling
# seed; from 0.5.19 the draft model's sample_from_anchor); each is given only where the release declares it.
LATER = dict(tp_sync=None, random_seed=0, greedy_draft=True)
declared = inspect.signature(dspark_draft.DraftBlockProposer.__init__).parameters

def fill():
    proposer = dspark_draft.DraftBlockProposer(
        draft_model=SimpleNamespace(sample_from_anchor=False), draft_model_runner=SimpleNamespace(device="cpu"),
        gamma=3, mask_token_id=0,
        draft_block_spec_info=SimpleNamespace(num_tokens_per_req=4, num_tokens_for_logprob_per_req=4),
        dp_moe_sync=True, **{name: value for name, value in LATER.items() if name in declared},
    )
    empty = torch.empty((0,), dtype=torch.int64)
    idle = ForwardBatch(
        forward_mode=ForwardMode.IDLE, batch_size=0, input_ids=empty, req_pool_indices=empty, seq_lens=empty,
        out_cache_loc=empty, seq_lens_sum=0, seq_lens_cpu=torch.empty((0,), dtype=torch.int64), positions=empty,
        spec_algorithm=SpeculativeAlgorithm.DSPARK, spec_info=None, capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    batch = SimpleNamespace(global_num_tokens=[2, 0], global_num_tokens_for_logprob=[2, 0],
                            can_run_dp_cuda_graph=False, can_run_decode_cuda_graph=False,
                            is_extend_in_batch=False, dp_spec_prefill_coordination_applied=False)
    proposer._fill_dp_moe_sync_metadata(idle, batch)
    return idle.original_global_num_tokens_cpu

before = fill()
from specserving_pdfix import fix
state = fix.apply()
print(json.dumps({"before": before, "after": fill(), "patches": sorted(state["patches"])}))
"""


# Every DSPARK release up to 0.5.22. 0.5.23's proposer reads its layout from a parallel config published when the
# process groups are built, which a CPU process without them cannot publish; its IDLE batch still runs through
# the guard and the real prepare_for_decode in test_first_decode.py.
@pytest.mark.parametrize(("version", "patched"), [(v, v == "0.5.16") for v in VERSIONS if "0.5.16" <= v <= "0.5.22"])
@runs_for(lambda version, patched: [script_run(version, IDLE_METADATA)])
def test_idle_draft_batch_gets_original_global_num_tokens(runner: Runner, version: str, patched: bool) -> None:
    out = runner.json(script_run(version, IDLE_METADATA))
    assert out["after"] == [2, 0]
    if patched:
        assert out["before"] is None  # the 0.5.16 bug: can_run_graph would take max(None)
        assert "idle_draft_metadata" in out["patches"]
    else:
        assert out["before"] == [2, 0]  # upstream sets it; the fix stays out
        assert "idle_draft_metadata" not in out["patches"]


# Replaces ScheduleBatch.prepare_for_decode by a recorder *before* the fix wraps it, so the guard can be
# observed without a KV pool; then calls it on batches that the PD decode loop can produce.
DECODE_GUARD = r"""
import json, torch
from types import SimpleNamespace
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

seen = []
def recorder(self):
    seen.append(type(self.spec_info).__name__ if self.spec_info is not None else None)
ScheduleBatch.prepare_for_decode = recorder

from specserving_pdfix import fix
fix.apply()
first = ScheduleBatch.__dict__["prepare_for_decode"]
fix.apply()
idempotent = ScheduleBatch.__dict__["prepare_for_decode"] is first

def batch(alg, n):
    return SimpleNamespace(spec_algorithm=SpeculativeAlgorithm[alg], spec_info=None, device="cpu",
                           reqs=[object()] * n)

out = {"idempotent": idempotent}
for alg in ("DSPARK", "DFLASH"):
    if alg not in SpeculativeAlgorithm.__members__:
        continue
    idle = batch(alg, 0)
    ScheduleBatch.prepare_for_decode(idle)
    out[alg + "_idle"] = [type(idle.spec_info).__name__, int(idle.spec_info.new_seq_lens.numel())]
    try:
        ScheduleBatch.prepare_for_decode(batch(alg, 2))
        out[alg + "_busy"] = "no error"
    except RuntimeError as exc:
        out[alg + "_busy"] = str(exc)
eagle = batch("EAGLE", 2)
ScheduleBatch.prepare_for_decode(eagle)
out["seen"] = seen
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.19", "0.5.23"])
@runs_for(lambda version: [script_run(version, DECODE_GUARD)])
def test_decode_guard(runner: Runner, version: str) -> None:
    out = runner.json(script_run(version, DECODE_GUARD))
    assert out["idempotent"] is True
    family = ["DFLASH"] + (["DSPARK"] if version >= "0.5.16" else [])
    for alg in family:
        # An IDLE batch gets an empty draft input, then SGLang's own prepare_for_decode runs.
        assert out[alg + "_idle"] == ["DFlashDraftInputV2", 0]
        # A batch with requests but no draft input fails with the cause, not with 'NoneType'.
        assert "without a draft input" in out[alg + "_busy"] and alg in out[alg + "_busy"]
    # Each idle call reached the original; the EAGLE batch passed through untouched (spec_info still None).
    assert out["seen"] == ["DFlashDraftInputV2"] * len(family) + [None]


PLUGIN = r"""
import json
from importlib.metadata import entry_points
eps = [f"{ep.name}={ep.value}" for ep in entry_points(group="sglang.srt.plugins")]
print(json.dumps({"entry_points": eps}))
"""


@runs_for(lambda: [script_run("0.5.23", PLUGIN)])
def test_entry_point_is_registered(runner: Runner) -> None:
    out = runner.json(script_run("0.5.23", PLUGIN))
    assert "specserving_pdfix=specserving_pdfix.plugin:load" in out["entry_points"]
