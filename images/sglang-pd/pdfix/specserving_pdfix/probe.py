"""Which speculative algorithms get a real PD-decode draft input in the installed SGLang: asked by calling it.

    python -m specserving_pdfix.probe [--require ALG,ALG] [--no-fix]

For every member of `SpeculativeAlgorithm` (but NONE) the probe calls the release's own
`build_disagg_draft_input` twice, with small CPU stand-ins for the batch and the scheduler's `FutureMap`:
once as a non-overlapped batch and once as an overlapped one. An algorithm "has a PD builder" when the
dispatcher returns a draft input (not None) without raising. For the overlapped call it also records
whether the draft input carries `future_indices` and whether the future map saw `publish` and `stash`,
and, for every call, which builder function actually ran (the upstream one or this package's).

Without --no-fix the fix is activated the way a server activates it: through SGLang's own
`sglang.srt.plugins.load_plugins()`, which runs this package's entry point. So a probe that reports
`fixActive: true` has also shown that the entry point is installed and loads.

Output: one JSON document on stdout. With --require, exit status 1 (and one line on stderr naming them)
when any required algorithm has no PD builder; 2 when the probe itself cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import traceback
from importlib import metadata
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import specserving_pdfix

#: Modules whose `build_*` functions are the upstream per-algorithm builders.
UPSTREAM_BUILDER_MODULES = (
    "sglang.srt.speculative.eagle_disaggregation",
    "sglang.srt.speculative.dspark_disaggregation",
    "sglang.srt.speculative.dflash_disaggregation",
)
#: Names under which builder modules read the server / speculative config (0.5.18+ read it from the
#: runtime context, which a probe process has not published); replaced by the stand-in during a call.
CONFIG_GETTERS = ("get_spec", "get_global_server_args", "get_server_args")

BATCH_SIZE = 2
HIDDEN_SIZE = 8


def sglang_version() -> str:
    return metadata.version("sglang")


# ---- stand-ins ---------------------------------------------------------------------------------------


class RecordingFutureMap:
    """Stands in for the scheduler's FutureMap: records what the builder publishes and stashes."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.stashed: list[dict[str, Any]] = []

    def publish(self, future_indices: Any, new_seq_lens: Any, *args: Any, **kwargs: Any) -> None:
        self.published.append({"indices": future_indices.tolist(), "seq_lens": new_seq_lens.tolist()})

    def stash(self, future_indices: Any, payload: Any) -> None:
        tokens = getattr(payload, "bonus_tokens", None)
        if tokens is None:
            tokens = getattr(payload, "verified_id", None)
        self.stashed.append(
            {
                "indices": future_indices.tolist(),
                "payload": type(payload).__name__,
                "bonus_tokens": None if tokens is None else tokens.tolist(),
            }
        )


def server_args_standin() -> SimpleNamespace:
    """The few speculative settings the upstream builders read (EAGLE: top-k 1, one step)."""
    return SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_num_steps=1,
        speculative_num_draft_tokens=2,
        enable_multi_layer_eagle=False,
        speculative_use_rejection_sampling=False,
        disaggregation_mode="decode",
        device="cpu",
    )


def batch_standin(overlap: bool) -> SimpleNamespace:
    """A prefilled batch of two requests as a PD decode node receives it, on CPU."""
    import torch

    reqs = [
        SimpleNamespace(
            rid=f"probe-{i}",
            output_ids=[100 + i],
            output_topk_p=[0.5],
            output_topk_index=[200 + i],
            hidden_states_tensor=torch.zeros(HIDDEN_SIZE, dtype=torch.float32),
            output_dsa_topk_indices=None,
            grammar=None,
        )
        for i in range(BATCH_SIZE)
    ]
    return SimpleNamespace(
        reqs=reqs,
        device="cpu",
        enable_overlap=overlap,
        seq_lens=torch.tensor([5, 7], dtype=torch.int64),
        seq_lens_cpu=torch.tensor([5, 7], dtype=torch.int64),
        req_pool_indices=torch.tensor([3, 4], dtype=torch.int64),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=["ProbeForCausalLM"]), vocab_size=256),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((8, 16), dtype=torch.int32)),
    )


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = module.__dict__.get(name, missing)
    setattr(module, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(module, name)
        else:
            setattr(module, name, old)


@contextlib.contextmanager
def probe_context(server_args: Any, calls: list[str]) -> Iterator[None]:
    """Stand-in config for the builder modules, and spies that record which builder runs."""
    from specserving_pdfix import builders

    with contextlib.ExitStack() as stack:
        for mod_name in UPSTREAM_BUILDER_MODULES:
            try:
                module = importlib.import_module(mod_name)
            except ImportError:
                continue
            for getter in CONFIG_GETTERS:
                if getter in module.__dict__:
                    stack.enter_context(_patched(module, getter, lambda: server_args))
            for attr, func in list(vars(module).items()):
                if attr.startswith("build_") and callable(func) and getattr(func, "__module__", "") == mod_name:
                    stack.enter_context(_patched(module, attr, _spy(func, f"{mod_name}.{attr}", calls)))
        ours = "build_dflash_family_draft_input"
        stack.enter_context(
            _patched(builders, ours, _spy(getattr(builders, ours), f"specserving_pdfix.builders.{ours}", calls))
        )
        yield


def _spy(func: Callable[..., Any], name: str, calls: list[str]) -> Callable[..., Any]:
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return func(*args, **kwargs)

    return spy


# ---- probing -----------------------------------------------------------------------------------------


def call_builder(algorithm: Any, overlap: bool) -> dict[str, Any]:
    """Call the release's dispatcher for one algorithm; describe what came back."""
    import inspect

    import torch

    batch = batch_standin(overlap)
    future_map = RecordingFutureMap()
    server_args = server_args_standin()
    last_tokens = torch.tensor([r.output_ids[-1] for r in batch.reqs], dtype=torch.int64)
    calls: list[str] = []
    dispatch = algorithm.build_disagg_draft_input
    takes_server_args = "server_args" in inspect.signature(dispatch).parameters
    result: dict[str, Any] = {"draftInput": None, "builder": None, "error": None}
    try:
        with probe_context(server_args, calls):
            if takes_server_args:
                draft = dispatch(batch, server_args, last_tokens, future_map)
            else:
                draft = dispatch(batch, last_tokens, future_map)
    except Exception as exc:  # a builder that raises on a well-formed batch is a broken builder
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc(limit=6)
        return result
    result["builder"] = calls[-1] if calls else None
    if draft is None:
        return result
    result["draftInput"] = type(draft).__name__
    if overlap:
        fi = getattr(draft, "future_indices", None)
        result["futureIndices"] = None if fi is None else fi.tolist()
        result["published"] = future_map.published
        result["stashed"] = future_map.stashed
    return result


def activate_fix() -> dict[str, Any]:
    """Run SGLang's own plugin loader (which runs our entry point); report the fix's state."""
    plugins = importlib.import_module("sglang.srt.plugins")
    plugins.load_plugins()
    from specserving_pdfix import fix

    return fix.state()


def run(use_fix: bool) -> dict[str, Any]:
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    alg_enum = spec_info.SpeculativeAlgorithm
    from specserving_pdfix import fix

    dispatcher_before = alg_enum.__dict__["build_disagg_draft_input"]
    fix_state = activate_fix() if use_fix else {"applied": False, "patches": {}}
    dispatcher = alg_enum.__dict__["build_disagg_draft_input"]
    algorithms = sorted(name for name in alg_enum.__members__ if name != "NONE")
    results: dict[str, Any] = {}
    for name in algorithms:
        member = alg_enum[name]
        results[name] = {"plain": call_builder(member, overlap=False), "overlap": call_builder(member, overlap=True)}
    with_builder = sorted(
        name
        for name, r in results.items()
        if r["plain"]["draftInput"] is not None and r["plain"]["error"] is None
    )
    return {
        "sglang": sglang_version(),
        "fixVersion": specserving_pdfix.__version__,
        "fixRequested": use_fix,
        "fixActive": bool(fix_state["applied"]),
        "patches": fix_state["patches"],
        "dispatcher": "specserving_pdfix" if fix.is_ours(dispatcher) else "upstream",
        "dispatcherUnchanged": dispatcher is dispatcher_before,
        "algorithms": algorithms,
        "pdBuilders": with_builder,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specserving_pdfix.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--require", default="", help="comma-separated algorithms that must have a PD builder")
    ap.add_argument("--no-fix", action="store_true", help="probe SGLang as shipped, without loading plugins")
    ap.add_argument(
        "--compare",
        action="store_true",
        help='probe as shipped, then load the fix and probe again; print {"upstream": ..., "withFix": ...}',
    )
    ns = ap.parse_args(argv)
    required = sorted({a.strip().upper() for a in ns.require.split(",") if a.strip()})
    if ns.compare:
        # One process instead of two (importing SGLang dominates the cost). The first pass runs before
        # any plugin is loaded, so it sees SGLang exactly as shipped.
        print(json.dumps({"upstream": run(use_fix=False), "withFix": run(use_fix=True)}, indent=2, sort_keys=True))
        return 0
    try:
        report = run(use_fix=not ns.no_fix)
    except Exception as exc:
        print(f"specserving_pdfix.probe: cannot probe this SGLang: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        return 2
    missing = [a for a in required if a not in report["pdBuilders"]]
    report["required"] = required
    report["missing"] = missing
    print(json.dumps(report, indent=2, sort_keys=True))
    if missing:
        unknown = [a for a in missing if a not in report["algorithms"]]
        detail = f" ({', '.join(unknown)} not in this SGLang's SpeculativeAlgorithm)" if unknown else ""
        print(
            f"specserving_pdfix.probe: SGLang {report['sglang']} "
            f"({'with' if report['fixActive'] else 'without'} the decode-path fix) has no PD-decode draft-input "
            f"builder for: {', '.join(missing)}{detail}; algorithms with one: {', '.join(report['pdBuilders'])}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
